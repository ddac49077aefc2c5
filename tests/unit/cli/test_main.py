"""cli/main.py: the entry point in this process (``main(argv)``, through ``clirun.invoke``, which
puts back what it sets for the process): help on stderr and exit 2 without a command, usage errors
in one line, ``--version`` and ``--help`` exit 0, offline by default, the command's exit code,
libraries' import-time warnings quieted. (The console script ``run()`` ends the process: exit
codes, the internal-error line and Ctrl-C are tests/integration/test_outputs.py's and
test_bad_input.py's.)"""

from __future__ import annotations

import io
import logging
import os
import sys

import pytest
from clirun import invoke
from safetensors.torch import save_file

from nan_hunter.cli import main as entry


def test_no_command_is_help_on_stderr_and_exit_2():
    code, out, err = invoke()
    assert code == 2 and out == "" and "Usage: nanhunter" in err and "scan" in err


@pytest.mark.parametrize("argv", [["--version"], ["-h"], ["scan", "--help"]])
def test_help_and_version_exit_0(argv):
    code, out, err = invoke(*argv)
    assert code == 0 and err == "" and out


def test_a_usage_error_is_one_line_and_2():
    code, out, err = invoke("scan", "x.safetensors", "--bogus")
    assert (code, out, err) == (
        2,
        "",
        "nanhunter: error: unrecognized arguments: --bogus (see `nanhunter scan --help`)\n",
    )


def test_missing_command_after_options_is_the_help():
    code, _, err = invoke(
        "--",
    )
    assert code == 2 and "Usage: nanhunter" in err


@pytest.mark.parametrize("value, code", [(1.0, 0), (float("nan"), 1)])
def test_the_commands_exit_code(tmp_path, value, code):
    import torch

    save_file({"w": torch.full((2,), value)}, str(tmp_path / "w.safetensors"))
    assert invoke("scan", tmp_path / "w.safetensors", "-q").code == code


def test_offline_unless_the_caller_says_otherwise(tmp_path, monkeypatch):
    """``main`` sets HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE only when unset (setdefault)."""
    import torch

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    save_file({"w": torch.ones(2)}, str(tmp_path / "w.safetensors"))
    assert entry.main(["scan", str(tmp_path / "w.safetensors"), "-q"]) == 0
    assert (os.environ["HF_HUB_OFFLINE"], os.environ["TRANSFORMERS_OFFLINE"]) == ("1", "0")


def test_quiet_libraries(monkeypatch):
    for name in entry.NOISY_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    entry.quiet_libraries()
    assert all(logging.getLogger(n).level == logging.ERROR for n in entry.NOISY_LOGGERS)


def test_stdout_is_devnull_only_for_the_null_device(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert entry._stdout_is_devnull() is False  # no file descriptor
    with open(os.devnull, "w") as null:
        monkeypatch.setattr(sys, "stdout", null)
        assert entry._stdout_is_devnull() is True
    with open(tmp_path / "f", "w") as f:
        monkeypatch.setattr(sys, "stdout", f)
        assert entry._stdout_is_devnull() is False
