"""``integrations.eval_loops.EvalLoops`` without a framework: an eval loop over a small model with one
bad sample — the training watch paused (the eval forwards are not its steps), the non-finite losses
counted per element, the first failing eval step located once, ``run.eval`` null before any loop."""

from __future__ import annotations

import logging

import torch
from torch import nn

import nan_hunter
from nan_hunter.integrations.eval_loops import EvalLoops


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.exp(self.lin(x)).sum(-1)  # per-sample "losses"


def _loop(ev: EvalLoops, model: nn.Module, xs: list[torch.Tensor], after: int | None, training=None) -> None:
    model.eval()
    ev.begin(after, training)
    with torch.no_grad():
        for x in xs:
            ev.loss(model(x))
    ev.end()
    model.train()


def test_a_loop_is_counted_located_once_and_kept_apart_from_training(caplog):
    torch.manual_seed(0)
    model = Net()
    ev = EvalLoops(logging.getLogger("test.eval"))
    assert ev.as_run() is None
    training = nan_hunter.watch(model)
    training.__enter__()
    ev.attach(model)
    good, bad = torch.randn(2, 4) * 0.1, torch.tensor([[0.0] * 4, [400.0] * 4])
    with caplog.at_level(logging.WARNING):
        _loop(ev, model, [good, bad, good], after=3, training=training)
        _loop(ev, model, [bad], after=6, training=training)
    assert not training.paused and training.n_forwards == 0 and training.first_failed is None
    # the exp runs in the root's own forward: the root ("") names it
    assert ev.as_run() == {
        "steps": 4,
        "nonfinite_losses": 2,
        "first_failed": 1,
        "after_step": 3,
        "module": "",
        "op": "aten.exp.default",
        "cause": "overflow",
    }
    assert ev.report.first_nonfinite.step == 1 and ev.report.run["eval"]["first_failed"] == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "first at eval step 1" in lines[0] and "after training step 6" in lines[1]
    ev.detach()
    training.__exit__(None, None, None)
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_a_clean_loop_says_nothing_and_counts_its_steps(caplog):
    model = Net()
    ev = EvalLoops(logging.getLogger("test.eval"))
    ev.attach(model)
    with caplog.at_level(logging.WARNING):
        _loop(ev, model, [torch.zeros(2, 4)] * 3, after=None)
    assert ev.as_run() == {
        "steps": 3,
        "nonfinite_losses": 0,
        "first_failed": None,
        "after_step": None,
        "module": None,
        "op": None,
        "cause": None,
    }
    assert ev.report is None and not caplog.records
    model(torch.zeros(1, 4))  # outside a loop: not counted
    assert ev.as_run()["steps"] == 3
    ev.detach()
