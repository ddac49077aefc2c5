"""Every fix nanhunter calls verified, re-applied by the fix oracle (``tests/oracle/fix_apply.py``,
no nanhunter code): the printed artifact (``diagnosis.fix_verified.applied_as``, and each verified
alternative's) applied with plain torch/transformers to a fresh copy of the whole model loaded
from the checkpoint directory, run on the same inputs: the model's outputs must be finite and
within the bisect tolerance (0.05) of fp32. Nothing is "verified" unless the oracle agrees.

Matrix: the shipped quick-start example, and planted faults (an MLP output past fp16's max, which
a policy fixes; q·kᵀ past fp16's max in eager attention, which SDPA or bf16 fixes) × the four
oracle models (Llama, Qwen2, GPT-2, T5). Default slice: the example and Llama; the rest is
``matrix_full`` (``NANHUNTER_FULL_MATRIX=1``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from oracle import fix_apply as O  # noqa: E402  (tests/ is on sys.path)
from oracle import planted as P  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-llama-fp16"
FULL = os.environ.get("NANHUNTER_FULL_MATRIX") == "1"
RTOL = 0.05
MLP_OUT = {"llama": "model.layers.1.mlp.down_proj", "qwen2": "model.layers.1.mlp.down_proj",
           "gpt2": "transformer.h.1.mlp.c_proj", "t5": "encoder.block.1.layer.1.DenseReluDense.wo"}


def _oracle_agrees(model_dir: Path, batch: dict, d: dict) -> list[str]:
    """Each verified fix of diagnosis ``d`` re-applied by the oracle; the kinds checked."""
    verified = [d["fix_verified"]] + [a["fix_verified"] for a in d.get("alternatives") or []]
    verified = [fv for fv in verified if fv and fv["finite"] and fv["scope"] == "model"]
    ref = O.reference(str(model_dir), batch)
    kinds = []
    for fv in verified:
        outs = O.apply_and_run(str(model_dir), batch, fv["applied_as"])
        ok, err = O.judge(outs, ref, RTOL)
        assert ok, (fv["change"], fv["applied_as"], err)
        kinds.append(fv["applied_as"]["kind"])
    if "Verified" in d["fix"]:
        assert d["fix_verified"]["finite"] and d["fix_verified"]["scope"] == "model"
    return kinds


def test_quick_start_fix_applied_as_printed_makes_the_example_finite(cli_main):
    """Issue 43: the quick start's fix said 'keep down_proj in fp32', which cannot work (its fp32
    output, 1.8e5, is past fp16's max) and raised a dtype mismatch when applied."""
    res = cli_main("scan", EXAMPLE, "--prompt", "the quick brown fox", "--dtype", "fp16")
    assert res.code == 1, res.stderr
    d = res.report["diagnosis"]
    fv = d["fix_verified"]
    assert fv["finite"] and fv["scope"] == "model" and fv["applied_as"]["kind"] == "policy", fv
    assert set(fv["applied_as"]["policy"]) == {"model.layers.1.mlp.down_proj", "model.norm"}  # = bisect's answer
    assert "_keep_in_fp32_modules" not in d["fix"]
    from transformers import AutoTokenizer

    batch = dict(AutoTokenizer.from_pretrained(EXAMPLE)("the quick brown fox", return_tensors="pt"))
    assert "policy" in _oracle_agrees(EXAMPLE, batch, d)


def _plant_mlp(model, family: str, batch: dict) -> None:
    """Scale the layer-1 MLP output projection so its fp32 output is ~1.5e5 (past fp16's max)."""
    name = MLP_OUT[family]
    seen = {}

    def see(mod, args, out):  # returns None: the output is left as it is
        seen.setdefault("a", float(out.abs().max()))

    h = model.get_submodule(name).register_forward_hook(see)
    with torch.no_grad():
        model(**batch)
    h.remove()
    with torch.no_grad():
        model.get_submodule(name).weight.mul_(1.5e5 / seen["a"])


def _batch(family: str, trigger: bool) -> dict:
    ids = [P.TRIGGER, 7, 9, 11] if trigger else [5, 7, 9, 11, 13]
    b = {"input_ids": torch.tensor([ids])}
    if family == "t5":
        b["decoder_input_ids"] = torch.tensor([[P.PAD, 7, 9]])
    return b


def _params():
    for family in ("llama", "qwen2", "gpt2", "t5"):
        for fault in ("mlp_overflow", "qk_overflow"):
            marks = [] if family == "llama" else [pytest.mark.matrix_full]
            if marks and not FULL:
                marks.append(pytest.mark.skip(reason="full matrix: NANHUNTER_FULL_MATRIX=1"))
            yield pytest.param(family, fault, marks=marks, id=f"{family}-{fault}")


@pytest.mark.parametrize(("family", "fault"), list(_params()))
def test_verified_fixes_hold_under_the_oracle(cli_main, tmp_path, family, fault):
    from safetensors.torch import save_file

    model = P.build(family).eval()
    batch = _batch(family, fault == "qk_overflow")
    if fault == "mlp_overflow":
        _plant_mlp(model, family, batch)
    else:
        P.plant_qk_overflow(model, torch.float16)
    d_dir = P.save_hf_dir(model, tmp_path / family)
    inputs = tmp_path / "inputs.safetensors"
    save_file(batch, str(inputs))
    if not bool(torch.isfinite(O.reference(str(d_dir), batch)[0]).all()):
        pytest.skip("the planted model is not finite in fp32: nothing to verify against")
    res = cli_main("scan", d_dir, "--inputs", inputs, "--dtype", "fp16", "--attn", "eager", "--device", "cpu")
    d = res.report["diagnosis"]
    if d is None:
        pytest.skip(f"{family} stays finite in fp16 with this plant (no fault to fix)")
    kinds = _oracle_agrees(d_dir, batch, d)
    print(f"{family}-{fault}: cause {d['cause']}, verified kinds re-applied by the oracle: {kinds}")
