"""Every incident class of docs/incidents.md, end to end through the real CLI with --json:
module, op, kind, role, exit code, cause, dtype matrix and the fix (examples/incidents/EXPECTED.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = yaml.safe_load((ROOT / "examples/incidents/EXPECTED.yaml").read_text())["incidents"]


def _args(case: dict) -> list[str]:
    args = ["scan", case["checkpoint"], "--arch", case["arch"], "--dtype", case["dtype"]]
    for i in case["inputs"]:
        args += ["--inputs", i]
    return args


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_incident(cli_main, name):
    case = EXPECTED[name]
    res = cli_main(*_args(case))
    assert res.code == case["exit_code"], (res.code, res.stderr, res.stdout[-2000:])
    r = res.report
    if "failed_inputs" in case:
        assert r["run"]["failed_inputs"] == case["failed_inputs"]
    fnf = r["first_nonfinite"]
    if case.get("module") is None and case["exit_code"] == 0:
        assert fnf is None
    else:
        assert fnf is not None, res.stdout
        assert fnf["module"] == case["module"]
        assert fnf["module_type"] == case["module_type"]
        assert fnf["kind"] == case["kind"]
        assert fnf["role"] == case["role"]
        assert fnf["input_index"] == case.get("input_index", 0)
        if case.get("op") is not None:
            assert fnf["op"] == case["op"]
    d = r["diagnosis"]
    if case.get("cause") is None:
        assert d is None or case["exit_code"] == 0
    else:
        assert d is not None and d["cause"] == case["cause"], d
        # a verified fix's text is that fix alone (contract v1.4): the rule's other advice is an alternative
        advice = " ".join([d["fix"], *(a["fix"] for a in d.get("alternatives") or [])]).lower()
        for word in case.get("fix_mentions", []):
            assert word.lower() in advice, (word, d["fix"])
        assert d["evidence"], "a diagnosis carries evidence lines"
    if r["replay"] is not None and case["role"] == "producer":
        finite = {dt for dt in ("fp32", "bf16", "fp16") if r["replay"][dt]["finite"]}
        assert finite == set(case["finite_in"]), r["replay"]
    if case.get("near_miss"):
        assert r["near_misses"], "expected a near-miss note"
    for op in case.get("mask_ops") or []:
        assert fnf is None or fnf["op"] != op


def _where(res) -> tuple:
    r = res.report
    fnf, d = r["first_nonfinite"], r["diagnosis"]
    loc = None if fnf is None else (fnf["module"], fnf["op"], fnf["kind"], fnf["role"], fnf["input_index"])
    return res.code, loc, None if d is None else d["cause"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_incident_on_cuda_matches_cpu(cli_main, name):
    """The same scan on the GPU (Triton capture, CUDA numerics) names the same module, op, kind,
    role and cause as on the CPU."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    case = EXPECTED[name]
    on_gpu = cli_main(*_args(case), "--device", "cuda")
    on_cpu = cli_main(*_args(case), "--device", "cpu")
    assert on_gpu.code == case["exit_code"], on_gpu.stderr
    assert _where(on_gpu) == _where(on_cpu)
