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


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


@pytest.mark.parametrize("level", ["blocks", "modules"])
def test_the_next_forward_takes_the_rows_a_step_measured_after_it(level):
    """A training loop measures every parameter after each step; the next forward's parameter
    rows are those rows (the same values), not a second read of every parameter: the rows match
    a fresh measurement, the forward reads only activations, and rows stay bounded."""
    torch.manual_seed(0)
    m = Stack()
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    x = torch.randn(1, 16)
    param_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    with Recorder(m, level=level, backward=True, optimizer=opt) as rec:
        for step in range(12):
            read = rec.sink.bytes_read
            out = m(x)
            if step:  # the first forward measures the parameters; later ones take the step's rows
                assert rec.sink.bytes_read - read < param_bytes / 4
            out.square().mean().backward()
            opt.step()
            opt.zero_grad()
        m(x)
        rows = rec.stats()
        mine = {(c.module, label): rows[r] for c in rec.calls_of(rec.current_step) for label, r in c.params}
        in_use = rec.sink.rows_in_use
    fresh = Recorder(m, level=level)
    with fresh, torch.no_grad():
        m(x)
    want = {(c.module, label): fresh.stats()[r] for c in fresh.calls for label, r in c.params}
    assert mine == want and len(mine) >= 4
    assert in_use <= 6 * 60  # kept steps x (activations, their gradients, parameters three ways)
