"""nan_hunter/explain/replay.py: the failing region re-run in every dtype against float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.capture.targeted import backward_region
from nan_hunter.dtypes import REPLAY_DTYPES
from nan_hunter.explain.replay import backward_replay, optimizer_replay, replay, run_region


class Scale(nn.Module):
    """y = x · 1e3: finite in fp32 and bf16, +inf in fp16 for x > 65.5."""

    def forward(self, x):
        return x * 1e3


class Sqrt(nn.Module):
    def forward(self, x):
        return torch.sqrt(x)


def test_forward_replay_matrix_shows_which_dtypes_overflow():
    x = torch.full((2, 3), 100.0)
    matrix = replay(Scale(), (x,), {})
    assert set(matrix) == {*REPLAY_DTYPES, "fp64"}
    assert matrix["fp32"]["finite"] and matrix["fp32"]["rel_err"] == 0.0
    assert matrix["bf16"]["finite"] and matrix["bf16"]["absmax"] == pytest.approx(1e5, rel=1e-2)
    assert (
        not matrix["fp16"]["finite"] and matrix["fp16"]["posinf"] == 6 and matrix["fp16"]["rel_err"] is None
    )
    assert matrix["fp64"].to_dict() == {
        "finite": True,
        "nan": 0,
        "posinf": 0,
        "neginf": 0,
        "absmax": 1e5,
        "rel_err": 0.0,
    }


def test_rounding_error_is_measured_against_float64():
    x = torch.full((4,), 1.0 / 3.0, dtype=torch.float64)
    matrix = replay(nn.Identity(), (x,), {})
    assert matrix["fp32"]["rel_err"] == pytest.approx(
        abs(float(torch.tensor(1 / 3, dtype=torch.float32)) - 1 / 3) * 3
    )
    assert matrix["fp32"]["rel_err"] < matrix["bf16"]["rel_err"] < 1e-2


def test_run_region_changes_neither_module_nor_inputs():
    lin = nn.Linear(2, 2)
    w = lin.weight.detach().clone()
    x = torch.ones(1, 2)
    (out,) = run_region(lin, (x,), {}, torch.float64)
    assert out.dtype == torch.float64
    assert (
        lin.weight.dtype == torch.float32 and torch.equal(lin.weight.detach(), w) and x.dtype == torch.float32
    )


def test_an_error_in_one_dtype_is_an_entry_not_an_exception():
    class Fussy(nn.Module):
        def forward(self, x):
            if x.dtype == torch.bfloat16:
                raise RuntimeError("no bf16 kernel\nmore detail")
            return x

    matrix = replay(Fussy(), (torch.ones(2),), {})
    assert matrix["bf16"]["error"] == "RuntimeError: no bf16 kernel" and not matrix["bf16"]["finite"]
    assert matrix["fp32"]["finite"]


def test_backward_region_keeps_the_inputs_and_incoming_gradient_of_one_call():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(2, 2), Scale(), nn.Linear(2, 1))
    x = torch.ones(3, 2)

    def step():
        m(x).sum().backward()

    target, args, kwargs, grads = backward_region(m, step, "1", 0)
    assert target is m[1] and kwargs == {}
    assert torch.allclose(args[0], m[0](x).detach())
    assert len(grads) == 1 and torch.allclose(grads[0], m[2].weight.detach().expand(3, 2))
    with pytest.raises(RuntimeError, match="did not happen"):
        backward_region(m, step, "1", 5)


def test_backward_replay_of_sqrt_at_zero():
    x = torch.tensor([[0.0, 4.0]])
    matrix = backward_replay(Sqrt(), (x,), {}, [torch.ones(1, 2)])
    assert not matrix["fp32"]["finite"] and matrix["fp32"]["posinf"] == 1  # d sqrt/dx at 0
    matrix = backward_replay(Scale(), (torch.ones(2),), {}, [torch.full((2,), 100.0)])
    assert matrix["fp32"]["finite"] and not matrix["fp16"]["finite"]  # 100 · 1e3 > 65504


def test_optimizer_replay_of_adam_eps_in_fp16():
    w = torch.ones(2)
    grad = torch.tensor([0.0, 1.0])
    matrix = optimizer_replay(torch.optim.Adam, {"lr": 1e-3, "eps": 1e-8}, w, grad, {})
    assert matrix["fp32"]["finite"] and matrix["fp64"]["finite"]
    assert not matrix["fp16"]["finite"] and matrix["fp16"]["nan"] == 1  # eps → 0: 0 / 0 where the grad is 0
    assert torch.equal(w, torch.ones(2)) and torch.equal(grad, torch.tensor([0.0, 1.0]))
