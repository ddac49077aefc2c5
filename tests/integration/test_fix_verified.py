"""Verified fixes on the shipped incidents (contract v1.2 "Verified fixes"): the proposed fix
applied to a copy and re-run on the failing input; the fix text says "verified" only when it
made the run finite; causes with no mechanical fix have none. In-process (``scan``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nan_hunter.pipeline.scan_checkpoint import scan

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = yaml.safe_load((ROOT / "examples/incidents/EXPECTED.yaml").read_text())["incidents"]

#: incident → (the change re-run, its largest allowed max_rel_err vs fp32; None: fp32 itself is not finite)
VERIFIED = {
    "ffn_wo_overflow": ("keep ffn.wo in fp32", 1e-6),
    "qk_overflow": ("run in bf16", 0.01),
    "residual_overflow": ("run in bf16", 0.01),
    "fp8_scale_reciprocal": ("keep quant in fp32", 1e-6),
    "eps_underflow": ("an eps fp16 can hold", 0.01),
    "masked_softmax": ("a safe softmax in attn", None),
}
NO_FIX = {
    "log_negative": "outside the op's domain",
    "nan_input": "input data is bad",
    "nan_weight": "checkpoint holds NaN/Inf",
}


def _scan(name: str):
    c = EXPECTED[name]
    return scan(
        str(ROOT / c["checkpoint"]),
        arch=str(ROOT / c["arch"].split(":")[0]) + ":" + c["arch"].split(":")[1],
        inputs=[str(ROOT / i) for i in c["inputs"]],
        dtype=c["dtype"],
        device="cpu",
    )


@pytest.mark.parametrize("name", sorted(VERIFIED))
def test_mechanical_fix_is_verified(name):
    rep = _scan(name)
    fv = rep.diagnosis.fix_verified
    change, bound = VERIFIED[name]
    assert fv is not None and fv.finite and change in fv.change, fv
    if bound is None:
        assert fv.max_rel_err is None  # fp32 itself is non-finite: nothing to compare with
    else:
        assert fv.max_rel_err is not None and fv.max_rel_err <= bound
    assert "Verified: " in rep.diagnosis.fix and change in rep.diagnosis.fix
    assert rep.to_dict()["diagnosis"]["fix_verified"]["finite"] is True


def test_a_finite_fix_far_from_fp32_is_not_verified():
    """Contract v1.4: verified = the model's outputs finite AND within tolerance of fp32. The safe
    softmax makes the finfo.min-mask incident finite, but its zeros are ~0.5 off fp32's answer
    (uniform attention over the masked row): tried, not verified, and the text never says so."""
    rep = _scan("finfo_min_mask")
    fv = rep.diagnosis.fix_verified
    assert fv is not None and fv.scope == "model" and not fv.finite and fv.max_rel_err > 0.05, fv
    assert "Verified" not in rep.diagnosis.fix


@pytest.mark.parametrize("name", sorted(NO_FIX))
def test_no_mechanical_fix_says_so(name):
    from nan_hunter.render.rows import fix_check_line

    rep = _scan(name)
    assert rep.diagnosis.fix_verified is None and "verified" not in rep.diagnosis.fix.lower()
    assert rep.to_dict()["diagnosis"]["fix_verified"] is None
    line, tone = fix_check_line(rep)
    assert line.startswith("no mechanical fix to verify") and NO_FIX[name] in line and tone == "none"


def test_the_users_model_is_not_changed():
    """The fix is applied to copies: the incident's model weights are bitwise what they were."""
    import torch

    from nan_hunter.dtypes import RunDtype
    from nan_hunter.explain.fix_check import Region, verify_fix
    from nan_hunter.report import Diagnosis

    lin = torch.nn.Linear(4, 8).half()
    with torch.no_grad():
        lin.weight.fill_(3000.0)
    before = {k: v.clone() for k, v in lin.state_dict().items()}
    x = torch.full((2, 4), 8.0, dtype=torch.float16)
    d = Diagnosis(
        "overflow", "fp16", "", "aten.addmm.default", "matmul overflow in fp16", [], "keep it in fp32"
    )
    fv = verify_fix(d, Region("", lin, (x,), {}), RunDtype.of("fp16"))
    # kept in fp32, 96000 stays in fp32 (apply_policy casts an output down only where it fits)
    assert fv is not None and fv.finite and fv.max_rel_err == 0.0 and fv.scope == "region"
    assert (
        all(torch.equal(before[k], v) for k, v in lin.state_dict().items())
        and lin.weight.dtype == torch.float16
    )
    assert torch.equal(x, torch.full((2, 4), 8.0, dtype=torch.float16))


def test_cli_verifies_sdpa_for_eager_fp16_attention_scores(tmp_path, cli_main):
    """``nanhunter scan`` on a saved tiny Llama (q_proj, k_proj ×1000) run with ``--attn eager --dtype
    fp16``: eager's q·kᵀ (~4e5) overflows fp16; the verified fix is SDPA, which keeps fp16 and is closer
    to the fp32 run than bf16. transformers' default attention (sdpa) gives no fault at all."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file

    cfg = transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=128
    )
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        m.model.layers[0].self_attn.q_proj.weight.mul_(1000.0)
        m.model.layers[0].self_attn.k_proj.weight.mul_(1000.0)
    m.save_pretrained(tmp_path / "llama", safe_serialization=True)
    inputs = tmp_path / "inputs.safetensors"
    save_file({"input_ids": torch.randint(0, 128, (1, 16))}, str(inputs))

    res = cli_main(
        "scan",
        tmp_path / "llama",
        "--inputs",
        inputs,
        "--dtype",
        "fp16",
        "--attn",
        "eager",
        "--device",
        "cpu",
    )
    assert res.code == 1, res.stderr
    d = res.report["diagnosis"]
    assert d["cause"] == "overflow" and "attention scores" in d["summary"]
    fv = d["fix_verified"]
    assert fv["change"] == 'attn_implementation="sdpa" instead of "eager"' and fv["finite"] is True, fv
    assert fv["scope"] == "model" and fv["max_rel_err"] is not None and fv["max_rel_err"] < 0.01
    assert (
        'Verified: attn_implementation="sdpa" instead of "eager" makes the model\'s outputs finite'
        in d["fix"]
    )
    assert 'attn_implementation="sdpa"' in res.stdout + res.stderr  # the check line of the terminal report

    clean = cli_main("scan", tmp_path / "llama", "--inputs", inputs, "--dtype", "fp16", "--device", "cpu")
    assert clean.code == 0 and clean.report["diagnosis"] is None


def test_a_fault_absorbed_before_the_output_is_not_verified_by_a_finite_output(tmp_path, cli_main):
    """A verification needs a failing control: the fp32 overflow is masked away before the model's
    output, so the output is finite with or without bf16; judged at the failing region (where bf16
    overflows too), run in bf16 is no fix."""
    import sys

    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    try:
        from absorbed_scores import build, failing_input
    finally:
        sys.path.remove(str(ROOT / "tests" / "models"))
    save_file(build().state_dict(), str(tmp_path / "model.safetensors"))
    save_file({"x": failing_input()}, str(tmp_path / "inputs.safetensors"))
    res = cli_main(
        "scan",
        tmp_path / "model.safetensors",
        "--arch",
        ROOT / "tests/models/absorbed_scores.py:build",
        "--inputs",
        tmp_path / "inputs.safetensors",
    )
    assert res.code == 1, res.stderr
    rep = res.report
    assert rep["first_nonfinite"]["module"] == "attn_scores" and rep["diagnosis"]["cause"] == "overflow"
    assert rep["run"]["dtype"] == "fp32"
    fv = rep["diagnosis"]["fix_verified"]
    assert fv is None or not fv["finite"], fv
    assert "Verified" not in rep["diagnosis"]["fix"] and "verified" not in res.stdout + res.stderr


def test_no_verification_without_a_failing_control():
    """A region that does not fail unchanged cannot verify a change: nothing is reported."""
    import torch

    from nan_hunter.dtypes import RunDtype
    from nan_hunter.explain.fix_check import Region, verify_fix
    from nan_hunter.report import Diagnosis

    lin = torch.nn.Linear(4, 8).half()
    x = torch.ones(2, 4, dtype=torch.float16)  # finite in fp16: the unchanged copy does not fail
    d = Diagnosis(
        "overflow", "fp16", "", "aten.addmm.default", "matmul overflow in fp16", [], "keep it in fp32"
    )
    assert verify_fix(d, Region("", lin, (x,), {}), RunDtype.of("fp16")) is None
    # the report says why, in a typed field, not "nothing could be re-run"
    from nan_hunter.explain.fix_check import UNVERIFIED, check
    from nan_hunter.render.rows import fix_check_line
    from nan_hunter.report import Report, RunInfo

    check(d, Region("", lin, (x,), {}), RunDtype.of("fp16"))
    assert d.fix_verified is None and d.fix_unverified == "control_finite"
    rep = Report(
        checkpoint={"path": "x", "format": "x", "n_tensors": None, "bytes": None},
        weights=None,
        run=RunInfo(dtype="fp16", device="cpu", n_inputs=1, failed_inputs=[0]),
        first_nonfinite=None,
        replay=None,
        diagnosis=d,
        notes=[],
        modules=[],
    )
    assert fix_check_line(rep) == (UNVERIFIED["control_finite"], "none")
    check(d, None, RunDtype.of("fp16"))
    assert d.fix_unverified == "not_rerun"
