"""Modes compose (docs/contract.md v1.2, "Modes compose"): under torchrun ``scan --backward`` and
``scan --generate`` split the data set as plain ``scan`` does — rank 0's report is the one a single
process writes, except ``rank`` and notes — and ``--device-map auto`` works with ``--backward``
and ``--generate``, finding the same fault as the plain run. (What stays refused is refused by
``ScanOptions`` with its reason: tests/unit/pipeline/test_options.py runs the whole matrix.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import invoke
from test_torchrun_split import DATA, EXAMPLE, normalized, torchrun

pytestmark = pytest.mark.slow  # real torchrun ranks and accelerate placements

DECODE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llama-decode-fp16"
KEY = ("input_index", "module", "op", "kind", "role", "phase", "step", "position")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("compose") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in DATA))
    return path


def _split_matches_one_process(tmp_path: Path, *args: object) -> tuple[dict, dict]:
    out = tmp_path / "out"
    out.mkdir()
    one = invoke("scan", *args, "--json", tmp_path / "one.json", "-q")  # one process: this one
    ranks = torchrun(tmp_path, "scan", *args, "--json", out / "report.json", "-q")
    assert [r["code"] for r in ranks] == [one.code, one.code], [r["stderr"][-2000:] for r in ranks]
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]
    single = json.loads((tmp_path / "one.json").read_text())
    split = json.loads((out / "report.json").read_text())
    assert normalized(split) == normalized(single)
    assert any("split across 2 ranks" in n for n in split["notes"])
    return single, split


def test_backward_splits_under_torchrun(data, tmp_path):
    single, split = _split_matches_one_process(
        tmp_path, EXAMPLE, "--data", data, "--dtype", "fp16", "--backward"
    )
    assert (
        split["run"]["backward"] is True and split["run"]["failed_inputs"] == single["run"]["failed_inputs"]
    )
    assert split["run"]["failed_inputs"] and split["first_nonfinite"]["rank"] in (0, 1)


def test_generate_splits_under_torchrun(tmp_path):
    data = tmp_path / "decode.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["the 1 2 3", "hello", "the 4 5", "a b"]))
    single, split = _split_matches_one_process(
        tmp_path, DECODE, "--data", data, "--dtype", "fp16", "--generate", "8"
    )
    g = split["run"]["generate"]
    assert g == single["run"]["generate"] and g["first_bad_step"] is not None
    assert split["first_nonfinite"]["step"] == single["first_nonfinite"]["step"] > 0


@pytest.mark.parametrize("extra", [("--backward",), ("--generate", "4")], ids=["backward", "generate"])
def test_device_map_composes(cli_main, data, tmp_path, extra):
    pytest.importorskip("accelerate")
    plain = cli_main("scan", EXAMPLE, "--data", data, "--dtype", "fp16", *extra, "-q")
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    placed = cli_main(
        "scan",
        EXAMPLE,
        "--data",
        data,
        "--dtype",
        "fp16",
        *extra,
        "--device-map",
        "auto",
        "--max-memory",
        "cpu=150KB",
        "-q",
        env={"TMPDIR": tmp},
    )
    assert placed.code == plain.code == 1, (plain.stderr, placed.stderr)
    a, b = plain.report["first_nonfinite"], placed.report["first_nonfinite"]
    assert [b[k] for k in KEY] == [a[k] for k in KEY]
    assert placed.report["run"]["failed_inputs"] == plain.report["run"]["failed_inputs"]
    assert not list(tmp.glob("nanhunter-offload-*"))
