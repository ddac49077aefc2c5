"""nan_hunter/locate/training_phases.py: backward location and the facts behind an optimizer fault."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.locate.training_phases import (
    OptimizerPieces,
    first_bad_step,
    locate_backward,
    optimizer_facts,
)

from .test_backward_op import _net


def test_locate_backward_names_the_module_and_the_op():
    m = _net(zero_first=True)
    x = torch.randn(3, 4)
    loc = locate_backward(m, lambda: m(x), [("out", torch.ones(3, 1))], step=2, device=torch.device("cpu"))
    assert loc.finding is not None and loc.finding.call.module == "1"  # the SqrtGate
    assert loc.finding.call.phase == "backward" and loc.finding.call.input_index == 2
    assert loc.event is not None and loc.event.grad_fn == "SqrtBackward0"
    assert any(r["module"] == "1" for r in loc.table)


def test_locate_backward_of_a_finite_step_finds_nothing():
    m = _net(zero_first=False)
    x = torch.randn(3, 4)
    loc = locate_backward(m, lambda: m(x), [("out", torch.ones(3, 1))], step=0, device=torch.device("cpu"))
    assert loc.finding is None and loc.event is None


def _adam_fp16_fault():
    """Adam in fp16: eps 1e-8 rounds to 0, so a parameter whose gradient is exactly 0 divides 0 by 0."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.ones(4, dtype=torch.float16))
    opt = torch.optim.Adam([p], lr=1e-3, eps=1e-8)
    p.grad = torch.tensor([1.0, 0.0, 2.0, 0.0], dtype=torch.float16)
    return p, opt


def test_optimizer_facts_explain_adam_eps_underflow():
    p, opt = _adam_fp16_fault()
    opt.step()
    facts = optimizer_facts(opt, p, "w")
    assert facts["optimizer"] == "Adam" and facts["param"] == "w" and facts["dtype"] == "fp16"
    assert facts["eps"] == pytest.approx(1e-8) and facts["eps_in_dtype"] == 0.0
    assert facts["nonfinite"] == 2 and facts["numel"] == 4
    assert facts["state"]["exp_avg_sq"]["zeros_where_nonfinite"] == 2
    assert facts["grad_zeros_where_nonfinite"] == 2
    assert facts["hyperparameters"]["lr"] == 1e-3 and facts["hyperparameters"]["betas"] == [0.9, 0.999]
    assert facts["state"]["step"] == 1.0


def test_first_bad_step_names_the_optimizer_op():
    p, opt = _adam_fp16_fault()
    ev = first_bad_step(opt)
    assert ev is not None and ev.op.startswith("aten.") and ev.kind == "nan"
    assert int(torch.isnan(p.detach()).sum()) == 2


def test_first_bad_step_of_a_finite_step_is_none():
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.ones(2)
    assert first_bad_step(opt) is None
    assert torch.allclose(p.detach(), torch.full((2,), 0.9))


def fp16_adam_pieces() -> tuple[nn.Parameter, OptimizerPieces]:
    p = nn.Parameter(torch.ones(4, dtype=torch.float16))
    pieces = OptimizerPieces(
        torch.optim.Adam,
        [{"lr": 1e-3, "eps": 1e-8, "foreach": False}],
        {"w": 0},
        {"w": torch.ones(4, dtype=torch.float16)},
        {"w": torch.zeros(4, dtype=torch.float16)},
        {},
    )
    return p, pieces  # eps is 0 in fp16: the step divides 0 by 0


def test_pieces_name_the_op_that_divided_by_zero_without_touching_what_they_hold():
    _, pieces = fp16_adam_pieces()
    ev = pieces.first_bad_op("w")
    assert ev is not None and ev.op == "aten.addcdiv_.default" and ev.kind == "nan" and ev.nan == 4
    assert torch.equal(pieces.weights["w"], torch.ones(4, dtype=torch.float16))  # the pre-step copy stays
    facts = pieces.facts("w")
    assert facts["optimizer"] == "Adam" and facts["eps_in_dtype"] == 0.0 and facts["nonfinite"] == 4


def test_pieces_without_the_parameter_outside_torch_optim_or_finite_name_nothing():
    _, pieces = fp16_adam_pieces()
    assert not pieces.has("other") and pieces.first_bad_op("other") is None

    class Mine(torch.optim.SGD):
        pass

    mine = OptimizerPieces(Mine, [{"lr": 0.1}], {"w": 0}, pieces.weights, pieces.grads, {})
    assert mine.first_bad_op("w") is None  # its class lives outside torch.optim: not rebuilt
    sgd = OptimizerPieces(
        torch.optim.SGD,
        [{"lr": 0.1}],
        {"w": 0},
        pieces.weights,
        {"w": torch.ones(4, dtype=torch.float16)},
        {},
    )
    assert sgd.first_bad_op("w") is None  # a finite step: no op
