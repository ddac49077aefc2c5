"""explain/fix_check: which causes have a mechanical fix, and the compile re-run as a fix."""

from __future__ import annotations

import math

import pytest

from nan_hunter.explain.fix_check import from_emulate_precision_casts, with_verdict
from nan_hunter.report import Diagnosis, FixVerified


def test_emulate_precision_casts_as_a_verified_fix():
    ok = from_emulate_precision_casts({"compiled_finite": True, "max_rel_err": 1e-3}, rtol=1e-2)
    opt = "torch._inductor.config.emulate_precision_casts = True"
    assert ok == FixVerified(
        opt, True, 1e-3, "model", "eager", {"kind": "option", "policy": None, "dtype": None, "option": opt}
    )
    far = from_emulate_precision_casts({"compiled_finite": True, "max_rel_err": 0.5}, rtol=1e-2)
    assert far is not None and not far.finite
    bad = from_emulate_precision_casts({"compiled_finite": False, "max_rel_err": math.inf}, rtol=1e-2)
    assert bad is not None and not bad.finite and bad.max_rel_err is None
    assert from_emulate_precision_casts(None, 1e-2) is None


def test_fix_text_says_verified_only_when_finite():
    d = Diagnosis("overflow", "fp16", "fc", None, "s", [], "Keep fc in fp32.")
    with_verdict(d, FixVerified("keep fc in fp32", False, None))
    assert "verified" not in d.fix.lower() and d.fix_verified.finite is False
    with_verdict(d, FixVerified("keep fc in fp32", True, 0.0))  # region scope: checked, not "verified" (v1.4)
    assert "verified" not in d.fix.lower()
    with_verdict(d, FixVerified("keep fc in fp32", True, 0.0, "model"))
    assert d.fix.endswith(
        "Verified: keep fc in fp32 makes the model's outputs finite, max rel err 0 vs fp32."
    )


# --- SDPA instead of eager attention: a real transformers model, the fault really in eager -------

SDPA = 'attn_implementation="sdpa" instead of "eager"'
T = 8


def _llama(qk_scale: float = 1.0):
    """A tiny LlamaForCausalLM in eager attention; q_proj and k_proj of layer 0 scaled by ``qk_scale``."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=128,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        attn = m.model.layers[0].self_attn
        attn.q_proj.weight.mul_(qk_scale)
        attn.k_proj.weight.mul_(qk_scale)
    return m, {"input_ids": torch.randint(0, 128, (1, T))}


def _region(model, batch, name):
    import torch

    from nan_hunter.capture.targeted import call_inputs
    from nan_hunter.explain.fix_check import Region

    with torch.no_grad():
        args, kwargs = call_inputs(model, lambda: model(**batch), name, 0)
    return Region(name, model.get_submodule(name), args, kwargs)


def _logits(model, batch):
    import torch

    with torch.no_grad():
        return model(**batch).logits


QK = "model.layers.0.self_attn"
QK_OVERFLOW = Diagnosis(
    "overflow",
    "fp16",
    QK,
    "aten.bmm.default",
    f"attention scores overflow in fp16 at aten.bmm.default in {QK}",
    [],
    "fix",
    mechanism="overflow",
    subject="attention_scores",
)


@pytest.mark.parametrize("whole", [True, False], ids=["model", "region"])
def test_sdpa_makes_eager_fp16_attention_scores_finite(whole):
    """q_proj, k_proj ×1000: q·kᵀ reaches ~4e5 > fp16 max in eager's matmul; SDPA on CPU computes the
    scores in fp32, so the same fp16 run is finite and close to the all-fp32 eager run — and SDPA, which
    keeps the run's dtype, is tried before bf16."""
    import torch

    from nan_hunter.dtypes import RunDtype
    from nan_hunter.explain.fix_check import verify_fix

    m, batch = _llama(qk_scale=1000.0)
    m.half()
    before = _logits(m, batch)
    assert not torch.isfinite(before).all()  # the fault is real: eager fp16 overflows
    state = {k: v.clone() for k, v in m.state_dict().items()}
    region = _region(m, batch, QK)
    kw = {"model": m, "batch": batch} if whole else {}
    fv = verify_fix(QK_OVERFLOW, region, RunDtype.of("fp16"), **kw)
    assert fv is not None and fv.change == SDPA and fv.finite, fv
    assert fv.scope == ("model" if whole else "region") and fv.reference == "fp32"
    assert fv.max_rel_err is not None and fv.max_rel_err < 0.01
    # the copy was changed, not the user's model: its config (shared by every layer) is still eager,
    # its weights and its (non-finite) output are what they were
    assert m.config._attn_implementation == "eager" and region.module.config is m.config
    assert all(torch.equal(state[k], v) for k, v in m.state_dict().items())
    assert torch.allclose(_logits(m, batch), before, rtol=0, atol=0, equal_nan=True)


def test_sdpa_replaces_nan_of_a_fully_masked_row():
    """A custom 4-D float mask with one query row entirely −inf: eager's softmax gives NaN there (in fp32
    too); SDPA gives that row zeros. Tried before the safe-softmax dispatch mode (a change users can make)."""
    import torch

    from nan_hunter.dtypes import RunDtype
    from nan_hunter.explain.fix_check import verify_fix

    m, batch = _llama()
    mask = torch.full((T, T), float("-inf")).triu(1)
    mask[0] = float("-inf")  # query 0 may attend to nothing
    batch["attention_mask"] = mask[None, None]
    assert torch.isnan(_logits(m, batch)).any()
    d = Diagnosis(
        "masked_softmax",
        "fp32",
        QK,
        "aten._softmax.default",
        f"softmax over a fully masked row at {QK}",
        [],
        "fix",
    )
    for kw in ({"model": m, "batch": batch}, {}):
        fv = verify_fix(d, _region(m, batch, QK), RunDtype.of("fp32"), **kw)
        assert fv is not None and fv.change == SDPA and fv.finite, fv
        assert fv.max_rel_err is None  # the fp32 eager run is NaN too: nothing to compare with
    assert m.config._attn_implementation == "eager" and torch.isnan(_logits(m, batch)).any()


def test_sdpa_order_per_cause():
    from nan_hunter.dtypes import RunDtype
    from nan_hunter.explain.fix_check import _changes

    def texts(d, run):
        return [c.text.split(" ")[0] for c in _changes(d, RunDtype.of(run), None)]

    assert texts(QK_OVERFLOW, "fp16") == ['attn_implementation="sdpa"', "run", "keep"]
    # never the dtype the run already computed in: no "run in bf16" for a bf16 run, no "keep in fp32" for fp32
    assert texts(QK_OVERFLOW, "bf16") == ['attn_implementation="sdpa"', "keep"]
    assert texts(QK_OVERFLOW, "fp32") == ['attn_implementation="sdpa"', "run"]
    masked = Diagnosis("masked_softmax", "fp32", QK, None, "softmax over a fully masked row", [], "fix")
    assert texts(masked, "fp32") == ['attn_implementation="sdpa"', "a"]
    matmul = Diagnosis("overflow", "fp16", "fc", None, "matmul overflow in fp16 at fc", [], "fix")
    assert SDPA not in [c.text for c in _changes(matmul, RunDtype.of("fp16"), None)]


def test_sdpa_does_not_apply_where_attention_is_not_eager():
    """Not applicable: a module with no transformers config, a model already in sdpa, and a module whose
    config says eager but whose code never calls scaled_dot_product_attention (nothing was changed)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from nan_hunter.dtypes import RunDtype
    from nan_hunter.explain.fix_check import _NotApplicable, _sdpa

    run = RunDtype.of("fp32")
    with pytest.raises(_NotApplicable), _sdpa(torch.nn.Linear(4, 4), "", run):
        pass
    m, batch = _llama()
    if hasattr(m, "set_attn_implementation"):
        m.set_attn_implementation("sdpa")
    else:  # transformers < 4.55: the attention modules read the config at call time
        m.config._attn_implementation = "sdpa"
    with pytest.raises(_NotApplicable), _sdpa(m, "", run):
        pass

    class NoDispatch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = transformers.LlamaConfig(attn_implementation="eager")
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).softmax(-1)

    nd = NoDispatch()
    with pytest.raises(_NotApplicable, match="never ran"), _sdpa(nd, "", run):
        nd(torch.ones(2, 4))


def test_change_follows_the_subject_not_the_summary_words():
    """Issue 43: the mechanical fix was picked by searching the summary for "attention scores";
    rewording the summary changed which fix was verified. The typed subject decides now."""
    from nan_hunter.dtypes import RunDtype
    from nan_hunter.explain.fix_check import _changes

    run = RunDtype.of("fp16")
    reworded = Diagnosis(
        "overflow",
        "fp16",
        QK,
        "aten.bmm.default",
        "q·kᵀ went past fp16's max",
        [],
        "fix",
        mechanism="overflow",
        subject="attention_scores",
    )
    assert _changes(reworded, run, None)[0].text == SDPA
    worded_but_mlp = Diagnosis(
        "overflow",
        "fp16",
        "mlp.fc",
        "aten.mm.default",
        "attention scores overflow (words only)",
        [],
        "fix",
        mechanism="overflow",
        subject="mlp",
    )
    assert all(c.text != SDPA for c in _changes(worded_but_mlp, run, None))


def test_division_that_ran_in_fp32_gets_no_dtype_change():
    """Issue 43: a 0/0 that computed in fp32 (CPU autocast leaves div in fp32 under bf16) must not be
    'fixed' by keeping the module in fp32: that is what already happened."""
    from nan_hunter.dtypes import RunDtype
    from nan_hunter.explain.fix_check import _changes

    d = Diagnosis("division_by_zero", "fp32", "head", "aten.div.Tensor", "s", [], "fix", mechanism="0/0")
    assert _changes(d, RunDtype.of("bf16"), None) == []
