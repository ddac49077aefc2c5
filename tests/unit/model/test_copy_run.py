"""``model.copy_run``: the one way a region runs again, on copies, at a precision."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.dtypes import RunDtype
from nan_hunter.model.copy_run import call, copy_at, run_copy, torch_dtype_of


class Grow(nn.Module):
    """Changes its input in place (as a KV cache grows) and records whether grad was on."""

    def forward(self, x, cache):
        cache.append(x.sum())
        x.add_(1)
        return x * 2, torch.is_grad_enabled()


def test_call_runs_on_copies_and_never_changes_the_callers_inputs():
    x, cache = torch.ones(3), []
    out, grad = call(Grow(), (x,), {"cache": cache})
    assert torch.equal(x, torch.ones(3)) and cache == []  # the copies grew, not the caller's
    assert torch.equal(out, torch.full((3,), 4.0)) and grad is False


def test_call_grad_none_keeps_the_callers_grad_mode():
    with torch.enable_grad():
        assert call(Grow(), (torch.ones(1),), {"cache": []}, grad=None)[1] is True
    with torch.no_grad():
        assert call(Grow(), (torch.ones(1),), {"cache": []}, grad=None)[1] is False


def test_copy_at_casts_module_and_float_inputs_not_ints_and_changes_neither():
    lin = nn.Linear(2, 2)
    x, idx = torch.ones(1, 2), torch.tensor([1])
    m, (a, i), _ = copy_at(lin, (x, idx), {}, RunDtype.of("fp16"))
    assert m is not lin and m.weight.dtype == torch.float16 and lin.weight.dtype == torch.float32
    assert a.dtype == torch.float16 and i.dtype == torch.int64 and x.dtype == torch.float32
    assert not m.training


def test_copy_at_training_none_keeps_the_modules_mode():
    d = nn.Dropout(0.5).train()
    assert copy_at(d, (), {}, torch.float64, training=None)[0].training
    assert not copy_at(d, (), {}, torch.float64)[0].training


def test_run_copy_at_float64_and_at_an_fp8_run():
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    ref = run_copy(lin, (x,), {}, torch.float64)
    assert ref.dtype == torch.float64 and not ref.requires_grad
    fp8 = run_copy(lin, (x,), {}, RunDtype.of("fp8-e4m3"))
    assert fp8.dtype == RunDtype.of("fp8-e4m3").torch_compute
    assert not torch.equal(fp8.double(), ref)  # fp8 emulation rounded the matmul operands


def test_torch_dtype_of_a_run_is_its_compute_dtype():
    assert torch_dtype_of(RunDtype.of("bf16")) == torch.bfloat16
    assert torch_dtype_of(RunDtype.of("fp8-e5m2")) == RunDtype.of("fp8-e5m2").torch_compute
    assert torch_dtype_of(torch.float64) == torch.float64
