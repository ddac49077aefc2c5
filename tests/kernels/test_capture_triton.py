"""Capture with the Triton backend (under TRITON_INTERPRET on CPU) gives the reference's answer:
the sink + batched kernel path that runs on CUDA, checked in CI without a GPU."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py) or a GPU", allow_module_level=True)

import nan_hunter  # noqa: E402
from nan_hunter.capture.sink import StatsSink  # noqa: E402

DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"  # where the kernels can read


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        return self.b(h), h  # two outputs; h is also b's input (measured once)


def test_triton_sink_rows_match_reference():
    torch.manual_seed(0)
    ts = [
        t.to(DEV)
        for t in (
            torch.randn(37),
            torch.tensor([1.0, float("nan"), -float("inf")]),
            torch.zeros(0),
            torch.randn(5, 7).half(),
        )
    ]
    tri = StatsSink(DEV, backend="triton")
    refs = StatsSink(DEV, backend="reference")
    rows = tri.measure_many(ts)
    assert rows == [0, 1, 2, 3]
    assert tri.measure(ts[0]) == 0  # same tensor, unchanged: not read again
    got = tri.rows()
    from nan_hunter.kernels.reference import full_row
    from nan_hunter.kernels.stats import TensorStats

    for t, g in zip(ts, got):
        want = TensorStats.from_row(*(x.tolist() for x in full_row(t)))
        assert (g.nan, g.posinf, g.neginf, g.first_nonfinite) == (
            want.nan,
            want.posinf,
            want.neginf,
            want.first_nonfinite,
        )
        assert g.absmax == pytest.approx(want.absmax)
    assert refs.measure_many(ts) == [0, 1, 2, 3]


def test_watch_with_triton_backend_locates_like_reference():
    torch.manual_seed(0)
    m = Net().half().eval().to(DEV)
    with torch.no_grad():
        m.a.weight.fill_(1.0)
        m.a.bias.zero_()
        m.b.weight.fill_(2000.0)  # 8 x 8 x 2000 = 128000 > 65504
        x = torch.ones(2, 8, device=DEV).half()
        reports = {}
        for backend in ("triton", "reference"):
            with nan_hunter.watch(m, level="modules", backend=backend) as w:
                m(x)
            reports[backend] = w.report().first_nonfinite
    assert reports["triton"] == reports["reference"]
    assert reports["triton"].module == "b"


class Gate(nn.Module):
    def forward(self, x):
        return x * torch.sqrt((x * x).mean(-1, keepdim=True))  # finite forward at 0, infinite derivative


def test_backward_capture_with_triton_backend_locates_like_reference():
    """Gradients go through the same sink and batched kernel as forward statistics. on_fault="stop":
    on a GPU the rows are read once per step, before the update, so the weights the faulty step ran
    with are kept for the backward re-run (with the default "record" and no read-back, a GPU run
    says in a note that the backward was not re-run: found on the first GPU run)."""
    found = {}
    for backend in ("triton", "reference"):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 8), Gate(), nn.Linear(8, 1)).to(DEV)
        with torch.no_grad():
            m[0].weight.zero_()
            m[0].bias.zero_()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with nan_hunter.watch(
            m, level="modules", backend=backend, backward=True, optimizer=opt, on_fault="stop"
        ) as w:
            m(torch.randn(4, 8).to(DEV)).pow(2).mean().backward()
            opt.step()
            found[backend] = w.report().first_nonfinite
    assert found["triton"] == found["reference"]
    assert (found["triton"].phase, found["triton"].module, found["triton"].grad_fn) == (
        "backward",
        "1",
        "SqrtBackward0",
    )
