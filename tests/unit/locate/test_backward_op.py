"""nan_hunter/locate/backward_op.py: a step's backward re-run from the gradients at its outputs."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.locate.backward_op import backward_roots, rerun_backward


class SqrtGate(nn.Module):
    """x · sqrt(mean(x²)): finite forward at x = 0, infinite derivative there (SqrtBackward0)."""

    def forward(self, x):
        return x * torch.sqrt((x * x).mean(-1, keepdim=True))


def _net(zero_first: bool) -> nn.Sequential:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), SqrtGate(), nn.Linear(4, 1))
    if zero_first:
        with torch.no_grad():
            m[0].weight.zero_()
            m[0].bias.zero_()
    return m


def test_backward_roots_leave_out_an_output_upstream_of_another():
    w = torch.ones(2, requires_grad=True)
    logits = w * 2
    loss = logits.sum()
    out = {"logits": logits, "loss": loss}
    roots, gs = backward_roots(out, [("logits", torch.ones(2)), ("loss", torch.tensor(1.0))])
    assert len(roots) == 1 and roots[0] is loss  # logits feeds loss: counted once, through loss
    roots, gs = backward_roots(out, [("loss", torch.tensor(8.0))], scale=4.0)
    assert float(gs[0]) == 2.0  # the GradScaler's scale divided out
    assert backward_roots(out, [("missing", torch.ones(1))]) == ([], [])


def test_rerun_backward_is_finite_on_a_healthy_step_and_leaves_grads_alone():
    m = _net(zero_first=False)
    x = torch.randn(3, 4)
    finite, ev = rerun_backward(m, lambda: m(x), [("out", torch.ones(3, 1))])
    assert finite and ev is None
    assert all(p.grad is None for p in m.parameters())  # gradients are returned, never accumulated


def test_rerun_backward_names_the_first_bad_op_and_its_autograd_node():
    m = _net(zero_first=True)  # the gate sees zeros: d sqrt / dx at 0 is inf, times 0 → NaN
    x = torch.randn(3, 4)
    finite, ev = rerun_backward(m, lambda: m(x), [("out", torch.ones(3, 1))], find_op=True)
    assert not finite
    assert ev is not None and ev.grad_fn == "SqrtBackward0"
    assert ev.kind in ("nan", "posinf")
    finite, ev = rerun_backward(m, lambda: m(x), [("out", torch.ones(3, 1))])
    assert not finite and ev is None  # without find_op no op is looked for
