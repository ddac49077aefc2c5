"""nan_hunter/capture/gradients.py: backward capture through a real ``Recorder(backward=True)``."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.capture.gradients import GradientHooks
from nan_hunter.capture.recorder import Recorder


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))


def _train_step(m: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    m.zero_grad()
    m(x).pow(2).sum().backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def test_every_module_gets_a_backward_call_and_gradients_are_unchanged():
    x = torch.randn(3, 4)
    plain = _train_step(_model(), x)
    m = _model()
    with Recorder(m, level="modules", backward=True) as rec:
        watched = _train_step(m, x)
    assert all(torch.equal(plain[n], watched[n]) for n in plain)  # hooks return None: grads untouched
    back = [c for c in rec.calls if c.phase == "backward"]
    assert sorted(c.module for c in back) == ["", "0", "1", "2"]
    rows = rec.stats()
    lin0 = next(c for c in back if c.module == "0")
    labels = [label for label, _ in lin0.outputs]
    assert "grad of weight" in labels and "grad of bias" in labels
    w_row = rows[dict(lin0.outputs)["grad of weight"]]
    assert w_row.numel == 16 and w_row.finite
    assert w_row.absmax == float(plain["0.weight"].abs().max())
    # the gradient that reached the root's output is kept by reference for a re-run of the backward
    assert [label for label, _ in rec.grads.root_grads[0]] == ["out"]


def test_a_non_finite_gradient_is_recorded_where_it_appeared():
    m = _model()
    with Recorder(m, level="modules", backward=True) as rec:
        y = m(torch.randn(2, 4))
        (y * float("inf")).sum().backward()  # d/dy = inf: every gradient below is non-finite
    rows = rec.stats()
    head = next(c for c in rec.calls if c.phase == "backward" and c.module == "2")
    incoming = rows[head.inputs[0][1]]
    assert incoming.posinf == 2 and not incoming.finite


def test_detach_removes_every_hook_and_a_parameter_grad_row_is_reused():
    m = _model()
    rec = Recorder(m, level="modules", backward=True)
    with rec:
        _train_step(m, torch.randn(2, 4))
        w = m[0].weight
        row = rec.grads.grad_row("0.weight", w.grad, 0)
        assert row is not None and rec.stats()[row].numel == 16  # the row its hook measured, same storage
        w.grad.add_(1.0)  # changed since: no longer that very gradient
        assert rec.grads.grad_row("0.weight", w.grad, 0) is None
    assert all(not p._backward_hooks for p in m.parameters())
    before = len(rec.calls)
    _train_step(m, torch.randn(2, 4))
    assert len(rec.calls) == before  # nothing recorded once detached


def test_no_grad_forwards_hook_nothing():
    m = _model()
    with Recorder(m, level="modules", backward=True) as rec, torch.no_grad():
        m(torch.randn(2, 4))
    assert not [c for c in rec.calls if c.phase == "backward"] and not rec.grads.root_grads


def test_only_a_recorder_with_backward_has_gradient_hooks():
    assert isinstance(Recorder(_model(), level="modules", backward=True).grads, GradientHooks)
    assert Recorder(_model(), level="modules").grads is None


def test_forget_drops_a_forwards_records_and_its_kept_gradients():
    m = _model()
    with Recorder(m, level="modules", backward=True) as rec:
        _train_step(m, torch.randn(2, 4))
        _train_step(m, torch.randn(2, 4))
        g = rec.grads
        assert 1 in g.root_grads and 1 in g.calls  # the latest step's are kept
        row = g.grad_row("0.weight", m[0].weight.grad, 1)
        g.forget(1)
        assert 1 not in g.root_grads and 1 not in g.calls
        assert row is not None and g.grad_row("0.weight", m[0].weight.grad, 1) is None


def test_a_second_backward_through_the_same_forward_is_a_new_event():
    m = _model()
    with Recorder(m, level="modules", backward=True) as rec:
        y = m(torch.randn(2, 4)).sum()
        y.backward(retain_graph=True)
        first = rec.grads.events
        y.backward()
    assert first > 0 and rec.grads.events == 2 * first
