"""``model.whole``: a fix's whole-model copy is cast from the full-precision weights (as the user
loads the checkpoint at that dtype), never from the copy already rounded to the run's dtype."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.dtypes import RunDtype
from nan_hunter.model.execute import cast_model
from nan_hunter.model.whole import WholeModel, master_of

#: a value fp16 rounds (to 1.0) and bf16 from fp32 rounds elsewhere (1.0078125): bf16(fp16(w)) != bf16(w)
W = 1.0 + 2**-8 + 2**-12


def _model() -> nn.Module:
    m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Dropout(0.5))
    with torch.no_grad():
        m[0].weight.fill_(W)
    return m


def test_master_is_the_weights_as_loaded_kept_through_the_cast():
    m = _model()
    master = master_of(m, RunDtype.of("fp16"), limit=1 << 20)
    cast_model(m, RunDtype.of("fp16"), torch.device("cpu"))
    assert m[0].weight.dtype == torch.float16 and master["0.weight"].dtype == torch.float32
    assert float(master["0.weight"][0, 0]) == W  # by reference, not rounded by the cast


def test_master_is_none_when_the_cast_changes_nothing_or_the_model_is_too_big():
    assert master_of(_model(), RunDtype.of("fp32"), limit=1 << 20) is None
    assert master_of(_model(), RunDtype.of("fp16"), limit=4) is None


def test_fresh_bf16_comes_from_the_full_precision_weights():
    """Issue 43 (the fix oracle, Qwen2): scan checked 'run in bf16' on bf16 of the fp16-rounded copy."""
    m = _model()
    master = master_of(m, RunDtype.of("fp16"), limit=1 << 20)
    m16 = cast_model(m, RunDtype.of("fp16"), torch.device("cpu"))
    whole = WholeModel(m16, (torch.ones(1, 2),), {}, master)
    fresh, (x,), _ = whole.fresh(RunDtype.of("bf16"))
    assert fresh[0].weight.dtype == torch.bfloat16 and x.dtype == torch.bfloat16
    assert float(fresh[0].weight.data[0, 0]) == float(torch.tensor(W).to(torch.bfloat16))
    assert float(fresh[0].weight.data[0, 0]) != float(m16[0].weight.data[0, 0].to(torch.bfloat16))
    assert m16[0].weight.dtype == torch.float16 and not fresh.training  # the user's model untouched


def test_call_puts_the_steps_rng_in_place_and_keeps_train_mode():
    m = _model()
    state = torch.random.get_rng_state()
    whole = WholeModel(
        m, (torch.ones(1, 2),), {}, training=True, seed=lambda: torch.random.set_rng_state(state)
    )
    fresh, a, kw = whole.fresh(RunDtype.of("fp32"))
    assert fresh.training
    assert torch.equal(whole.call(fresh, a, kw), whole.call(fresh, a, kw))  # the same dropout mask each call
