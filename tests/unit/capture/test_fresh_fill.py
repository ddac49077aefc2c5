"""``capture.fresh_fill``: a region re-run with fresh allocations NaN-filled and zero-filled tells an
uninitialised read (the fault follows the fill) from arithmetic (it does not), names the op that
read the unwritten memory, and leaves the RNG and the deterministic flags as they were."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from nan_hunter.capture.fresh_fill import FreshFill, fill_verdict


class PadPool(nn.Module):
    """Pads a batch to ``rows`` rows with torch.empty and sums over them: the padding is read."""

    def __init__(self, rows: int = 6) -> None:
        super().__init__()
        self.rows = rows

    def forward(self, x):
        out = torch.empty(self.rows, x.shape[-1], dtype=x.dtype)
        out[: x.shape[0]] = x
        return out.sum(0)


class PadWritten(PadPool):
    """The same allocation, every row written before it is read: no uninitialised read."""

    def forward(self, x):
        out = torch.empty(x.shape[0], x.shape[-1], dtype=x.dtype)
        out[:] = x
        return out.sum(0)


class Overflow(nn.Module):
    def forward(self, x):
        buf = torch.empty_like(x)
        buf.copy_(x)
        return (buf * 1e38).exp()


class PadReturned(nn.Module):
    """Returns the padded buffer unread: the allocation itself is named."""

    def forward(self, x):
        out = x.new_empty(x.shape[0] + 2, x.shape[1])
        out[: x.shape[0]] = x
        return out


def test_padding_rows_read_unwritten_is_an_uninitialised_read():
    v = fill_verdict(PadPool(), (torch.randn(3, 4),), {})
    assert v.uninitialised and v.allocations == 1
    assert (v.nan_fill_finite, v.zero_fill_finite) == (False, True)
    assert v.op.op == "aten.sum.dim_IntList" and v.op.mechanism == "uninitialised_read"
    assert v.op.kind == "nan"


def test_an_allocation_returned_unread_names_the_allocation():
    v = fill_verdict(PadReturned(), (torch.randn(3, 4),), {})
    assert v.uninitialised and v.op.op.startswith("aten.new_empty")


@pytest.mark.parametrize(
    "module,expected",
    [
        ("written", (True, None)),  # every element written: the NaN fill is overwritten, finite
        ("overflow", (False, False)),  # arithmetic: non-finite with either fill
    ],
)
def test_arithmetic_and_fully_written_buffers_are_not_uninitialised(module, expected):
    m = PadWritten() if module == "written" else Overflow()
    v = fill_verdict(m, (torch.randn(3, 4),), {})
    assert not v.uninitialised and v.op is None
    assert (v.nan_fill_finite, v.zero_fill_finite) == expected


def test_no_allocation_no_second_run():
    v = fill_verdict(nn.Linear(4, 4), (torch.randn(2, 4),), {})
    assert v.allocations == 0 and v.zero_fill_finite is None and not v.uninitialised


def test_views_copies_and_writes_are_not_reads():
    """A slice, a clone and an in-place write into the fresh buffer move or overwrite it: the first
    op that computes with it is the reader."""
    mode = FreshFill(math.nan)
    with mode:
        buf = torch.empty(4, 2)
        buf[:2].fill_(1.0)
        c = buf.clone().t()
        c.mul(2)
    assert mode.allocations == 1 and mode.reader is not None and mode.reader.op == "aten.mul.Tensor"


def test_integer_allocations_are_zero_filled_and_rng_and_flags_kept():
    torch.manual_seed(7)
    x = torch.randn(3, 4)
    before = torch.get_rng_state()
    det = torch.are_deterministic_algorithms_enabled()
    with FreshFill(math.nan):
        idx = torch.empty(3, dtype=torch.long)
    assert idx.tolist() == [0, 0, 0]

    class Dropped(PadPool):
        def forward(self, x):
            return nn.functional.dropout(super().forward(x), 0.5, training=True)

    assert fill_verdict(Dropped(), (x,), {}).uninitialised
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.are_deterministic_algorithms_enabled() == det


def test_a_region_that_cannot_run_again_gives_none():
    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("custom kernel")

    assert fill_verdict(Broken(), (torch.randn(2),), {}) is None
