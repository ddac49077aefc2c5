"""Issue 43's wrong answers about *why*, end to end through ``nanhunter.watch``: the dtype an op
computed in under CPU autocast, and a mechanism (never ``unknown``) for located ops in a loss, a
reduction and a backward formula."""

from __future__ import annotations

import torch
from torch import nn

import nan_hunter


class MaskedMean(nn.Module):
    """A masked mean computed in fp32 (as losses are): every element masked → 0/0."""

    def forward(self, x, mask):
        return (x.float() * mask).sum() / mask.sum()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.pool = MaskedMean()

    def forward(self, x, mask):
        return self.pool(self.fc(x), mask)


def test_zero_over_zero_under_bf16_cpu_autocast_is_labelled_fp32():
    """CPU autocast lowers the linear to bf16, not the division: the div ran in fp32, and the fix
    must not say 'fp16's smallest normal' nor 'compute in fp32' (what already happened)."""
    torch.manual_seed(0)
    m = Net()
    with nan_hunter.watch(m) as w, torch.autocast("cpu", dtype=torch.bfloat16):
        m(torch.randn(2, 8), torch.zeros(2, 8))
    rep = w.report()
    f, d = rep.first_nonfinite, rep.diagnosis
    assert f is not None and f.op == "aten.div.Tensor" and f.dtype == "fp32"
    assert d.cause == "division_by_zero" and d.mechanism == "0/0" and d.dtype == "fp32"
    assert "smallest normal" not in d.fix and "compute the norm/denominator in fp32" not in d.fix
    assert (
        d.fix_verified is None
        or d.fix_verified.applied_as is None
        or d.fix_verified.applied_as["kind"] != "dtype"
    )


class Loss(nn.Module):
    def forward(self, logits, target):
        return nn.functional.cross_entropy(logits, target)


def test_cross_entropy_with_every_target_ignored_is_an_empty_reduction():
    m = Loss()
    with nan_hunter.watch(m) as w:
        m(torch.randn(3, 5), torch.full((3,), -100))
    d = w.report().diagnosis
    assert d.cause == "empty_reduction" and d.mechanism == "empty_reduction" and d.subject == "loss", d


class LogTimesZero(nn.Module):
    """A focal-style term: 0 · log(p) with p = 0 → 0 · (−inf) = NaN."""

    def forward(self, p, y):
        return (y * torch.log(p)).sum()


def test_log_zero_times_zero_is_zero_times_inf_not_unknown():
    m = LogTimesZero()
    with nan_hunter.watch(m) as w:
        m(torch.tensor([0.0, 0.5]), torch.tensor([0.0, 1.0]))
    d = w.report().diagnosis
    assert d.mechanism == "0*inf" and d.cause == "invalid_operation", d
    assert d.cause != "unknown"


def test_adam_eps_rounding_to_zero_in_fp16_has_a_mechanism():
    """The optimizer-update family: Adam's eps 1e-8 is 0 in fp16; where a weight's gradient is 0 the
    update is 0 / (sqrt(0) + 0) = 0/0. The step is located without an op, but not without a mechanism."""
    torch.manual_seed(0)
    m = nn.Linear(4, 4).half()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-8)
    x = torch.randn(2, 4).half()
    x[:, 0] = 0  # weight column 0 gets a zero gradient
    with nan_hunter.watch(m, backward=True, optimizer=opt) as w:
        for _ in range(2):
            loss = m(x).float().pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    rep = w.report()
    f, d = rep.first_nonfinite, rep.diagnosis
    assert f.phase == "optimizer" and f.dtype == "fp16"
    assert (d.cause, d.mechanism, d.subject) == ("division_by_zero", "0/0", "optimizer_state"), d
