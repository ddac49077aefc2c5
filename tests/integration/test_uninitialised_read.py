"""Cause ``uninitialised_read`` on real forwards watched by ``nan_hunter.watch``: padding rows left as
``torch.empty`` that flow into a pooled sum and into attention scores are named as a read of memory
never written (the op that read it, mechanism and cause), while a real overflow in a module that
also allocates with ``torch.empty`` stays ``overflow``.

The original run is made deterministic the way a user's is: under
``torch.use_deterministic_algorithms(True)`` torch fills fresh float allocations with NaN
(``torch.utils.deterministic.fill_uninitialized_memory``, on by default), so the unwritten rows
are NaN on every run. The verdict itself comes from nanhunter's own NaN- and zero-filled re-runs
of the failing module, which set no global flag: the test checks that the user's deterministic
setting and RNG are as they were."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

import nan_hunter


@contextlib.contextmanager
def deterministic():
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev)


class PadPool(nn.Module):
    """Pads the batch to ``rows`` rows with torch.empty and sums over them (the padding is read)."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows = rows

    def forward(self, x):
        out = torch.empty(self.rows, x.shape[-1], dtype=x.dtype)
        out[: x.shape[0]] = x
        return out.sum(0)


class Pooled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj, self.pool, self.head = nn.Linear(4, 4), PadPool(6), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.pool(self.proj(x)))


class PaddedKV(nn.Module):
    """Attention over keys padded to a block of ``block`` rows with torch.empty (a stale KV block)."""

    def __init__(self, d: int = 8, block: int = 8) -> None:
        super().__init__()
        self.q, self.k, self.block = nn.Linear(d, d), nn.Linear(d, d), block

    def forward(self, x):
        k = x.new_empty(self.block, x.shape[-1])
        k[: x.shape[0]] = self.k(x)
        scores = self.q(x) @ k.t() / x.shape[-1] ** 0.5
        return scores.softmax(-1)


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = PaddedKV()

    def forward(self, x):
        return self.attn(x)


class BufferedExp(nn.Module):
    """Writes every row of a torch.empty buffer, then overflows: arithmetic, not an uninitialised read."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        buf = torch.empty_like(x)
        buf.copy_(self.lin(x))
        return (buf * 1e38).exp()


def _watched(model, x):
    with nan_hunter.watch(model) as w:
        model(x)
    return w.report().as_report().to_dict()


def test_padding_rows_read_by_a_sum_are_an_uninitialised_read():
    torch.manual_seed(0)
    m, x = Pooled(), torch.randn(3, 4)
    rng = torch.get_rng_state()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    with deterministic():
        rep = _watched(m, x)
        assert torch.are_deterministic_algorithms_enabled()  # the user's setting, as it was during the report
        assert torch.utils.deterministic.fill_uninitialized_memory == fill
    assert torch.equal(torch.get_rng_state(), rng)
    f, d = rep["first_nonfinite"], rep["diagnosis"]
    assert (f["module"], f["op"], f["kind"]) == ("pool", "aten.sum.dim_IntList", "nan")
    assert "out.sum(0)" in f["source"]
    assert (d["cause"], d["mechanism"]) == ("uninitialised_read", "uninitialised_read")
    assert any("filled with NaN" in n and "filled with zeros" in n for n in rep["notes"])


def test_a_stale_kv_block_read_by_the_scores_matmul():
    torch.manual_seed(0)
    with deterministic():
        rep = _watched(Attn(), torch.randn(5, 8))
    f, d = rep["first_nonfinite"], rep["diagnosis"]
    assert f["module"] == "attn" and f["op"].startswith("aten.mm")
    assert (d["cause"], d["mechanism"]) == ("uninitialised_read", "uninitialised_read")
    assert d["subject"] == "attention_scores"


def test_an_overflow_beside_a_fully_written_empty_buffer_stays_arithmetic():
    torch.manual_seed(0)
    with deterministic():  # the buffer is NaN-filled by torch, then written: nothing reads the fill
        rep = _watched(BufferedExp(), torch.randn(3, 4))
    f, d = rep["first_nonfinite"], rep["diagnosis"]
    assert f["op"] == "aten.exp.default"
    assert (d["cause"], d["mechanism"]) == ("overflow", "overflow")
    assert not any("fresh allocations" in n for n in rep["notes"])
