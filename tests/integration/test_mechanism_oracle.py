"""nanhunter's ``diagnosis.mechanism`` held against the mechanism oracle (``tests/oracle/ieee.py``,
which shares no code with nanhunter): mechanism × op family (pointwise, matmul, reduction,
softmax, norm, loss, backward formula) × precision (fp32, bf16, fp16, CPU autocast bf16).

Each fault is made inside a small module from finite inputs and weights, run once under the
oracle and once under ``nanhunter.watch``; compared: the op, the mechanism, and that the cause is
never ``unknown`` with a mechanism. The default slice runs every case in fp32 and every precision
on a few cases; the full cross product is ``matrix_full`` (``NANHUNTER_FULL_MATRIX=1``).
``uninitialised_read`` is held against the fill oracle (``tests/oracle/fill.py``): a padded key
matrix read by the scores matmul, and an overflow beside a fully written ``torch.empty`` buffer.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from oracle.fill import fill_cause
from oracle.ieee import classify, first_new  # tests/ is on sys.path, as for tests/models
from torch import nn

import nan_hunter

FULL = os.environ.get("NANHUNTER_FULL_MATRIX") == "1"


def _big(dt: torch.dtype) -> float:
    return torch.finfo(dt).max / 4


class Case(nn.Module):
    """``forward(x)`` computes ``body(self, x)``; ``x`` is a finite tensor of the run's dtype."""

    def __init__(self, body, width: int = 4):
        super().__init__()
        self.body = body
        self.lin = nn.Linear(width, width)
        with torch.no_grad():
            self.lin.weight.copy_(torch.eye(width))
            self.lin.bias.zero_()

    def forward(self, x):
        return self.body(self, self.lin(x))


def _zero_p(x):
    return x * 0  # exact zeros made from the input (no non-finite input)


CASES = {
    # name: (family, body, expected mechanism)
    "0*inf": ("pointwise", lambda m, x: _zero_p(x) * torch.log(_zero_p(x)), "0*inf"),
    "inf-inf": ("pointwise", lambda m, x: torch.log(_zero_p(x)) - torch.log(_zero_p(x)), "inf-inf"),
    "0/0": ("pointwise", lambda m, x: _zero_p(x) / _zero_p(x), "0/0"),
    "x/0": ("pointwise", lambda m, x: (x + 1) / _zero_p(x), "x/0"),
    "inf/inf": ("pointwise", lambda m, x: torch.log(_zero_p(x)) / torch.log(_zero_p(x)), "inf/inf"),
    "log(0)": ("pointwise", lambda m, x: torch.log(_zero_p(x)), "log(0)"),
    "domain": ("pointwise", lambda m, x: torch.sqrt(x - 10), "domain"),
    "overflow": ("pointwise", lambda m, x: (x + 1) * _big(x.dtype) * 8, "overflow"),
    "exp overflow": ("pointwise", lambda m, x: torch.exp(x + 200), "overflow"),
    "matmul overflow": (
        "matmul",
        lambda m, x: (x + 1) * _big(x.dtype) ** 0.5 @ ((x + 1).t() * _big(x.dtype) ** 0.5 * 16),
        "overflow",
    ),
    "matmul 0*inf": ("matmul", lambda m, x: torch.log(_zero_p(x)) @ _zero_p(x).t(), "0*inf"),
    "mean over nothing": ("reduction", lambda m, x: x[:, :0].mean(1), "empty_reduction"),
    "var of one": ("reduction", lambda m, x: x[:, :1].var(1), "empty_reduction"),
    "masked row": (
        "softmax",
        lambda m, x: x.masked_fill(torch.tensor([[True] * 4, [False] * 4]), float("-inf")).softmax(-1),
        "all_masked_row",
    ),
    "layer_norm eps 0": ("norm", lambda m, x: F.layer_norm(_zero_p(x), (4,), eps=0.0), "0*inf"),
    "all targets ignored": (
        "loss",
        lambda m, x: F.cross_entropy(x, torch.full((2,), -100)),
        "empty_reduction",
    ),
    # batch norm in eval divides by sqrt(running_var + eps): a zero running variance with eps 0 (x/0),
    # a corrupted negative one (the root of a negative); group norm's groups of one element (or of equal
    # values): biased variance 0, x − mean 0, times rsqrt(0 + eps 0) = ∞ (F.batch_norm refuses eps 0
    # and one value per channel in training, so those cannot be planted through it)
    "batch_norm running var 0": (
        "norm",
        lambda m, x: F.batch_norm(x, torch.zeros(4, dtype=x.dtype), torch.zeros(4, dtype=x.dtype), eps=0.0),
        "x/0",
    ),
    "batch_norm running var < 0": (
        "norm",
        lambda m, x: F.batch_norm(x, torch.zeros(4, dtype=x.dtype), -torch.ones(4, dtype=x.dtype)),
        "domain",
    ),
    "group_norm group of one": ("norm", lambda m, x: F.group_norm(x, 4, eps=0.0), "0*inf"),
    "group_norm equal values": (
        "norm",
        lambda m, x: F.group_norm(_zero_p(x).reshape(2, 2, 2) + 1, 2, eps=0.0),
        "0*inf",
    ),
}

PRECISIONS = ["fp32", "bf16", "fp16", "autocast-bf16"]
DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "autocast-bf16": torch.float32}
#: the default slice: every case in fp32, every precision on these
SLICE = {"0/0", "matmul overflow", "masked row", "all targets ignored", "0*inf", "group_norm group of one"}


def _params():
    for name in CASES:
        for prec in PRECISIONS:
            marks = [] if prec == "fp32" or name in SLICE else [pytest.mark.matrix_full]
            if marks and not FULL:
                marks.append(pytest.mark.skip(reason="full matrix: NANHUNTER_FULL_MATRIX=1"))
            yield pytest.param(name, prec, marks=marks, id=f"{name}-{prec}")


def _run(m: nn.Module, x: torch.Tensor, prec: str):
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if prec == "autocast-bf16" else torch.no_grad()
    with ctx:
        return m(x)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("name", "prec"), list(_params()))
def test_mechanism_agrees_with_the_ieee_oracle(name, prec):
    family, body, expected = CASES[name]
    torch.manual_seed(0)
    dt = DT[prec]
    m = Case(body).to(dt).eval()
    x = torch.rand(2, 4, dtype=dt) + 0.5
    ev = first_new(lambda: _run(m, x, prec))
    assert ev is not None
    truth = classify(ev)
    assert truth == expected, (name, prec, ev.op, truth)  # the oracle itself is right on the planted case
    with nan_hunter.watch(m) as w:
        _run(m, x, prec)
    rep = w.report()
    d, f = rep.diagnosis, rep.first_nonfinite
    assert f is not None and f.op is not None and f.op.split(".")[1] == ev.op, (f.op, ev.op)
    assert d.mechanism == truth, (name, prec, d.cause, d.mechanism, truth)
    assert d.cause != "unknown"


def test_backward_formula_sqrt_at_zero_agrees():
    """The backward family: SqrtBackward0 divides the incoming gradient by 2·sqrt(0)."""

    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(4))

        def forward(self, x):
            return torch.sqrt(self.w * x).sum()

    m = Root()
    x = torch.ones(4)
    loss = m(x)
    ev = first_new(lambda: loss.backward(retain_graph=True))
    truth = classify(ev)
    m.zero_grad()
    with nan_hunter.watch(m, backward=True) as w:
        m(x).backward()
    d = w.report().diagnosis
    assert truth == "x/0" and d.mechanism == truth and d.subject == "gradient", d


class PaddedScores(nn.Module):
    """Keys padded to 6 rows with torch.empty and read by the scores matmul (an uninitialised read)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        k = torch.empty(6, x.shape[-1], dtype=x.dtype)
        k[: x.shape[0]] = self.lin(x)
        return (x @ k.t()).softmax(-1)


class WrittenThenOverflow(nn.Module):
    """A torch.empty buffer written in full, then an overflow: arithmetic."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        buf = torch.empty_like(x)
        buf.copy_(self.lin(x))
        return (buf * _big(x.dtype)).exp()


@pytest.mark.parametrize(
    ("model", "expected"), [(PaddedScores, "uninitialised_read"), (WrittenThenOverflow, None)]
)
def test_uninitialised_read_agrees_with_the_fill_oracle(model, expected):
    """The fill oracle (``tests/oracle/fill.py``) and nanhunter agree on whether the fault follows the fill of
    fresh allocations, and on the op that read them. The original run is made to fault as a user's does,
    under ``torch.use_deterministic_algorithms(True)`` (fresh float memory filled with NaN by torch)."""
    torch.manual_seed(0)
    m, x = model().eval(), torch.rand(2, 4) + 0.5
    truth, reader = fill_cause(lambda: m(x))
    assert truth == expected
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with nan_hunter.watch(m) as w:
            m(x)
        rep = w.report()
    finally:
        torch.use_deterministic_algorithms(prev)
    d, f = rep.diagnosis, rep.first_nonfinite
    if truth is None:
        assert d.mechanism == "overflow" and d.cause == "overflow"
        return
    assert (d.mechanism, d.cause) == (truth, truth)
    assert f.op.split(".")[1] == reader == "mm"
