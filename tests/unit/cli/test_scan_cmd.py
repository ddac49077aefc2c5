"""cli/scan_cmd.py: ``nanhunter scan`` as its function — outputs checked before any work, the
configuration read first, the report's exit code, the JSON written (with the command line), the
view on stdout (on stderr when the JSON takes stdout), the strip shown for a failing run unless
``--no-strip``, and every file written remembered to be announced."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.cli import options, output, scan_cmd
from nan_hunter.errors import BadInput


@pytest.fixture
def nan_file(tmp_path):
    w = torch.ones(4, 4)
    w[1, 2] = float("nan")
    save_file({"lin.weight": w}, str(tmp_path / "w.safetensors"))
    return str(tmp_path / "w.safetensors")


def _model(m: dict) -> dict:
    return {"checkpoint": m["ck"], "arch": m["arch"], "inputs": [m["inputs"]]}


def test_weights_only_nan(nan_file, tmp_path, capsys):
    assert scan_cmd.command(nan_file, json=str(tmp_path / "r.json"), quiet=True) == 1
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["run"] is None and [t["name"] for t in rep["weights"]["nonfinite"]] == ["lin.weight"]
    assert (
        capsys.readouterr().out == "" and output.was_written("--json") is False
    )  # --quiet: nothing announced


def test_a_failing_run_with_its_strip_and_command_line(overflow_model, tmp_path, capsys):
    options.COMMAND_LINE = ["nanhunter", "scan", "model"]
    code = scan_cmd.command(**_model(overflow_model), dtype="fp16", json=str(tmp_path / "r.json"))
    out = capsys.readouterr().out
    assert code == 1 and "headroom per module call" in out
    assert out.splitlines()[-1] == "✘ overflow: +inf first produced by down at aten.addmm (fp16)"
    rep = json.loads((tmp_path / "r.json").read_text())
    assert (
        rep["run"]["command"] == ["nanhunter", "scan", "model"] and rep["first_nonfinite"]["module"] == "down"
    )
    assert output.was_written("--json")


@pytest.mark.parametrize(
    "dtype, strip, shown", [("fp16", False, False), ("fp32", None, False), ("fp32", True, True)]
)
def test_strip_flag(overflow_model, capsys, dtype, strip, shown):
    scan_cmd.command(**_model(overflow_model), dtype=dtype, strip=strip, no_replay=True)
    assert ("headroom per module call" in capsys.readouterr().out) is shown


def test_json_to_stdout_moves_the_view_to_stderr(nan_file, capsys):
    assert scan_cmd.command(nan_file, json="-") == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["schema"] == "nanhunter.report/v1" and "lin.weight" in err


def test_trace_is_written_and_remembered(overflow_model, tmp_path):
    trace = tmp_path / "t.jsonl"
    scan_cmd.command(**_model(overflow_model), dtype="fp32", trace=str(trace), quiet=False)
    assert trace.read_text().startswith('{"schema":"nanhunter.trace/v1"')
    assert output.was_written("--trace")


@pytest.mark.parametrize("flag", ["json", "trace"])
def test_an_output_onto_an_input_is_refused_before_any_work(nan_file, flag):
    with open(nan_file, "rb") as f:
        before = f.read()
    with pytest.raises(BadInput, match="is an input"):
        scan_cmd.command(nan_file, **{flag: nan_file})
    with open(nan_file, "rb") as f:
        assert f.read() == before


def test_a_bad_configuration_is_refused_first(nan_file, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("near_miss: {overflow_fraction: abc}\n")
    with pytest.raises(BadInput, match="bad.yaml"):
        scan_cmd.command(nan_file, config=str(cfg), json=str(tmp_path / "r.json"))
    assert not (tmp_path / "r.json").exists()


def test_help_and_examples():
    assert scan_cmd.HELP.startswith("Scan weights") and all(
        cmd.startswith("nanhunter scan ") for _, cmd in scan_cmd.EXAMPLES
    )
