"""nan_hunter/capture/optimizer_step.py: one ``optimizer`` call per parameter around ``step()``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.capture.optimizer_step import OptimizerHooks, parameter_owners
from nan_hunter.capture.recorder import Recorder


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight


def test_parameter_owners_first_name_wins_for_tied_weights():
    m = Tied()
    owners = parameter_owners(m)
    assert owners[id(m.emb.weight)] == ("emb.weight", "emb", "Embedding")
    assert len(owners) == 1


def test_a_step_records_before_grad_and_after_per_parameter():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    m[1].bias.requires_grad_(False)  # no gradient: not part of the step
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    with Recorder(m, level="modules", backward=True, optimizer=opt) as rec:
        m(torch.ones(1, 2)).sum().backward()
        before = m[0].weight.detach().clone()
        opt.step()
    calls = [c for c in rec.calls if c.phase == "optimizer"]
    assert [c.param for c in calls] == ["0.weight", "0.bias", "1.weight"]
    assert [c.seq for c in calls] == [0, 1, 2] and [c.module for c in calls] == ["0", "0", "1"]
    rows = rec.stats()
    w = calls[0]
    assert [label for label, _ in w.inputs] == ["0.weight before the step", "grad of 0.weight"]
    assert rows[w.inputs[0][1]].absmax == pytest.approx(float(before.abs().max()))
    assert rows[w.outputs[0][1]].absmax == pytest.approx(float(m[0].weight.detach().abs().max()))
    assert rec.optimizer.steps == 1


def test_a_step_that_makes_a_parameter_non_finite_is_seen_after_the_step():
    m = nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    with Recorder(m, level="modules", backward=True, optimizer=opt) as rec:
        m(torch.ones(1, 2)).sum().backward()
        m.weight.grad.fill_(float("inf"))
        opt.step()
    rows = rec.stats()
    w = next(c for c in rec.calls if c.phase == "optimizer" and c.param == "weight")
    assert rows[w.inputs[0][1]].finite and not rows[w.inputs[1][1]].finite
    assert rows[w.outputs[0][1]].neginf == 2  # w - inf


def test_hooks_are_removed_and_a_non_optimizer_is_refused():
    m = nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with Recorder(m, optimizer=opt):
        assert opt._optimizer_step_pre_hooks
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        OptimizerHooks(Recorder(m), object())
