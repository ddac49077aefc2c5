"""nan_hunter/model/execute.py: casting by the run dtype, targeted re-runs, weights rebinding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.capture.targeted import call_inputs
from nan_hunter.dtypes import RunDtype
from nan_hunter.errors import BadInput
from nan_hunter.model.execute import (
    cast_batch,
    cast_model,
    resolve_device,
    weights_as,
    weights_copy,
)


class Kw(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        return self.lin(x)


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(BadInput, match="use auto, cpu or cuda"):
        resolve_device("tpu")


def test_cast_model_and_batch_follow_the_run_dtype_and_keep_integers():
    m = cast_model(Kw().train(), RunDtype.of("bf16"), torch.device("cpu"))
    assert m.lin.weight.dtype == torch.bfloat16 and m.steps.dtype == torch.int64 and not m.training
    kw = cast_batch(
        {"x": torch.ones(2), "ids": torch.arange(2), "flag": True}, RunDtype.of("fp16"), torch.device("cpu")
    )
    assert kw["x"].dtype == torch.float16 and kw["ids"].dtype == torch.int64 and kw["flag"] is True
    kw = cast_batch({"x": torch.ones(2)}, None, torch.device("cpu"))
    assert kw["x"].dtype == torch.float32


def test_call_inputs_copies_one_call_and_stops_the_forward_there():
    after = []

    class Tail(nn.Module):
        def forward(self, x):
            after.append(1)
            return x

    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), Tail())
    x = torch.ones(1, 2)
    args, kwargs = call_inputs(m, lambda: m(x), "1", 0)
    assert torch.allclose(args[0], m[0](x).detach()) and kwargs == {}
    assert after == []  # nothing after the call was computed
    assert not m[1]._forward_pre_hooks
    with pytest.raises(RuntimeError, match="did not happen"):
        call_inputs(m, lambda: m(x), "1", 1)


def test_weights_as_rebinds_for_the_duration_and_never_writes_the_users_tensors():
    m = Kw()
    saved = weights_copy(m)
    assert set(saved) == {"lin.weight", "lin.bias", "steps"}
    w = m.lin.weight
    before = w.detach().clone()
    other = {"lin.weight": torch.full((2, 2), 7.0), "lin.bias": torch.zeros(3)}  # wrong shape: not bound
    with weights_as(m, other):
        assert m.lin.weight is w and torch.equal(w.detach(), torch.full((2, 2), 7.0))
        assert m.lin.bias.shape == (2,)
    assert torch.equal(w.detach(), before) and torch.equal(other["lin.weight"], torch.full((2, 2), 7.0))
    with weights_as(m, None):
        assert torch.equal(m.lin.weight.detach(), before)


def test_quantized_form_names_the_method_and_keeps_the_model_uncast():
    from types import SimpleNamespace

    from nan_hunter.model.execute import own_compute_dtype, quantized_form

    plain = torch.nn.Linear(2, 2)
    assert quantized_form(plain) is None
    q = torch.nn.Linear(2, 2).to(torch.bfloat16)
    q.is_quantized = True
    q.config = SimpleNamespace(quantization_config={"quant_method": "bitsandbytes"})
    q.dtype = torch.bfloat16
    assert quantized_form(q) == "bitsandbytes" and own_compute_dtype(q) == "bf16"
    # cast_model leaves a quantized model's dtype alone (transformers refuses to cast bitsandbytes models)
    assert cast_model(q, RunDtype.of("fp16"), torch.device("cpu")).weight.dtype == torch.bfloat16
