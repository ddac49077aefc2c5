"""Reports people can act on (contract v1.2): ``first_nonfinite.source_file``/``source_line``,
``run.command`` (the argv as run) and ``inputs[i].text`` in the JSON; in-process through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from nan_hunter.cli.main import main
from nan_hunter.report import FirstNonfinite, Report, split_source

ROOT = Path(__file__).resolve().parents[2]
INC = ROOT / "examples/incidents/ffn_wo_overflow"


def test_split_source():
    assert split_source("/a/b/model.py:34  return self.wo(x)  # x:1") == (
        "/a/b/model.py",
        34,
        "return self.wo(x)  # x:1",
    )
    assert split_source("C:/x/m.py:7") == ("C:/x/m.py", 7, None)
    assert split_source(None) == (None, None, None)
    f = FirstNonfinite(0, "fc", "Linear", "aten.mm.default", "posinf", "producer", source="m.py:3  y = fc(x)")
    assert (f.source_file, f.source_line) == ("m.py", 3)


def test_cli_json_has_source_command_and_text(tmp_path):
    out = tmp_path / "r.json"
    argv = [
        "scan",
        str(INC / "model.safetensors"),
        "--arch",
        f"{INC / 'model.py'}:build",
        "--inputs",
        str(INC / "inputs.safetensors"),
        "--dtype",
        "fp16",
        "--json",
        str(out),
        "--quiet",
    ]
    assert main(argv) == 1
    r = json.loads(out.read_text())
    f = r["first_nonfinite"]
    assert f["source_file"].endswith("ffn_wo_overflow/model.py") and isinstance(f["source_line"], int)
    assert (
        Path(f["source_file"])
        .read_text()
        .splitlines()[f["source_line"] - 1]
        .strip()
        .startswith("return self.wo")
    )
    assert r["run"]["command"] == ["nanhunter", *argv]
    assert r["inputs"][0]["text"] is None  # a safetensors file, not text


def test_inputs_text_is_cut_at_500_chars():
    rep = Report(
        run={"dtype": "fp32"},
        inputs=[
            {"index": 0, "label": "prompt 0", "finite": True},
            {"index": 1, "label": "x.safetensors", "finite": True},
        ],
    )
    rep.add_context(command=["nanhunter", "scan", "m"], texts=["é" * 900, None])
    d = rep.to_dict()
    assert d["inputs"][0]["text"] == "é" * 500 and d["inputs"][1]["text"] is None
    assert d["run"]["command"] == ["nanhunter", "scan", "m"]
    assert Report(run={"dtype": "fp32"}).to_dict()["run"]["command"] is None  # the API: present and null
