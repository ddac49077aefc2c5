"""explain.keep_fix: scan's keep-in-fp32 fix is the smallest keep set bisect's search finds, applied
with ``apply_policy`` to a fresh copy and judged on the model's outputs (a real transformers Llama
(the shipped example) whose down_proj overflows fp16 in its last layer: keeping down_proj alone leaves an fp32 residual
stream that the fp16 lm_head cannot take; down_proj and the final norm together work)."""

from __future__ import annotations

from pathlib import Path

import torch

from nan_hunter.dtypes import RunDtype
from nan_hunter.explain.keep_fix import find_keep_set, verify_policy
from nan_hunter.model.placement import dtype_keyword
from nan_hunter.model.whole import WholeModel

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny-llama-fp16"


def _llama():
    """The quick start's shipped example (a real Llama checkpoint), at full precision, on its prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = AutoModelForCausalLM.from_pretrained(
        EXAMPLE, attn_implementation="eager", **{dtype_keyword(): torch.float32}
    ).eval()  # torch_dtype before 4.56
    tok = AutoTokenizer.from_pretrained(EXAMPLE)
    return m, dict(tok("the quick brown fox", return_tensors="pt"))


def test_keep_set_is_down_proj_and_the_final_norm():
    m, batch = _llama()
    with torch.no_grad():
        ref = m(**batch).logits
    m16 = m.half()
    with torch.no_grad():
        assert not torch.isfinite(m16(**batch).logits).all()  # the fault is real
    kf = find_keep_set(
        WholeModel(m16, (), batch), RunDtype.of("fp16"), "model.layers.1.mlp.down_proj", rtol=0.05
    )
    assert kf is not None and kf.finite, kf
    assert "model.layers.1.mlp.down_proj" in kf.keep and len(kf.keep) >= 2
    assert kf.policy == {"dtype": "fp16", "keep_dtype": "fp32", "modules": {k: "fp32" for k in kf.keep}}
    assert "model.layers.1.mlp.down_proj" in kf.stayed_high  # its output does not fit fp16
    assert kf.max_rel_err is not None and kf.max_rel_err < 0.05
    assert torch.isfinite(ref).all()


def test_down_proj_alone_does_not_work_as_printed_before():
    """Issue 43: 'keep down_proj in fp32' alone, applied with apply_policy, raises (fp32 activations
    reach an fp16 matmul) or stays non-finite: it is never a verified fix."""
    m, batch = _llama()
    master = {k: v.detach().float().clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        ref = [m(**batch).logits]
    pol = {"dtype": "fp16", "keep_dtype": "fp32", "modules": {"model.layers.1.mlp.down_proj": "fp32"}}
    finite, err, _ = verify_policy(WholeModel(m, (), batch), master, RunDtype.of("fp16"), pol, ref)
    assert not finite and err is None
