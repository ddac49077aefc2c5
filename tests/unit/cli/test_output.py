"""cli/output.py: what commands print and write — files announced after the view (none with
``--quiet``), outputs planned and checked before any work, progress only on a terminal, ``--report``
notes, the terminal limits from the configuration."""

from __future__ import annotations

import io
import sys
from types import SimpleNamespace

import pytest

from nan_hunter import outputs
from nan_hunter.cli import output
from nan_hunter.config import default_config
from nan_hunter.errors import BadInput
from nan_hunter.outputs import Output

from ..render.reports import clean, overflow


def test_say(capsys):
    output.say("wrote r.json (--json)")
    assert capsys.readouterr().err == "nanhunter: wrote r.json (--json)\n"


def test_written_files_are_announced_once_at_the_end(tmp_path, capsys):
    output.collect_written(quiet=False)
    outputs.write_text("--json", str(tmp_path / "r.json"), "{}\n")
    output.wrote("--trace", str(tmp_path / "t.jsonl"))
    assert (
        output.was_written("--json") and output.was_written("--trace") and not output.was_written("--report")
    )
    assert capsys.readouterr().err == ""  # not yet: the view comes first
    output.announce_written()
    assert capsys.readouterr().err.splitlines() == [
        f"nanhunter: wrote {tmp_path / 'r.json'} (--json)",
        f"nanhunter: wrote {tmp_path / 't.jsonl'} (--trace)",
    ]
    output.announce_written()
    assert capsys.readouterr().err == "" and outputs._written_listener is None


def test_quiet_announces_nothing(tmp_path, capsys):
    output.collect_written(quiet=True)
    outputs.write_text("--json", str(tmp_path / "r.json"), "{}\n")
    output.wrote("--trace", "t.jsonl")
    output.announce_written()
    assert capsys.readouterr().err == "" and not output.was_written("--json")


def test_planned_outputs():
    args = SimpleNamespace(json="r.json", junit=None, report="r.md")
    assert output.planned_outputs(args, [("json", "--json"), ("junit", "--junit")], n_reports=2) == [
        Output("--json", "r.json"),
        Output("--report", "r.md", text=False),  # a page never goes to stdout
        Output("--report", "r-1.png", text=False),
        Output("--report", "r-2.png", text=False),
    ]


def _args(**kw):
    return SimpleNamespace(**{"inputs": None, "data": None, "config": None, "arch": None, **kw})


def test_check_command_outputs(tmp_path):
    ck = tmp_path / "m.safetensors"
    ck.write_bytes(b"x")
    assert output.check_command_outputs([Output("--json", "-")], _args(), [str(ck)]) is True
    assert (
        output.check_command_outputs([Output("--json", str(tmp_path / "r.json"))], _args(), [str(ck)])
        is False
    )
    with pytest.raises(BadInput, match="is an input"):
        output.check_command_outputs([Output("--json", str(ck))], _args(), [str(ck)])


def test_no_progress_off_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert output.scan_progress() == (None, None)
    assert output.stage_progress() is None and output.stage_progress(quiet=True) is None


def test_report_file_and_its_notes(tmp_path, capsys, monkeypatch):
    output.write_report_file(overflow(), None)
    assert list(tmp_path.iterdir()) == []
    for name in [n for n in sys.modules if n.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    output.write_report_file(overflow(), str(tmp_path / "r.html"))
    assert (tmp_path / "r.html").exists()
    assert capsys.readouterr().err.startswith("nanhunter: plot omitted: matplotlib is not installed")
    output.write_report_file(overflow(), str(tmp_path / "q.html"), quiet=True)
    assert capsys.readouterr().err == ""


def test_write_json(tmp_path):
    output.write_json(clean(), None)
    output.write_json(clean(), str(tmp_path / "r.json"))
    assert '"schema": "nanhunter.report/v1"' in (tmp_path / "r.json").read_text()


def test_terminal_limits_come_from_the_configuration():
    cfg = default_config()
    assert output.terminal_limits(cfg) == {
        "near_miss_max_listed": cfg.near_miss.max_listed,
        "weights_max_rows": cfg.weights.max_rows,
        "weights_targets": cfg.weights.targets,
    }
