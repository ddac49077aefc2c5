"""The device-row sink (Triton backend, under TRITON_INTERPRET on CPU): segments that grow
without copying, batches that straddle a segment boundary, both launchers, one read-back."""

from __future__ import annotations

import math
import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py) or a GPU", allow_module_level=True)

from nan_hunter.capture import sink as sink_mod  # noqa: E402
from nan_hunter.kernels.reference import full_row  # noqa: E402
from nan_hunter.kernels.stats import TensorStats  # noqa: E402

DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"  # where the kernels can read


def _tensors(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    out = []
    for i in range(n):
        t = torch.randn(17 + 5 * i, generator=g) * 10 ** (i % 6)
        if i % 4 == 1:
            t[i % t.numel()] = math.nan
        if i % 5 == 2:
            t[-1] = -math.inf
        out.append(t.to((torch.float32, torch.float16, torch.bfloat16)[i % 3]).to(DEV))
    return out


def _want(t: torch.Tensor) -> TensorStats:
    return TensorStats.from_row(*(x.tolist() for x in full_row(t)))


def _same(got: TensorStats, want: TensorStats) -> None:
    for k in (
        "numel",
        "nan",
        "posinf",
        "neginf",
        "zero",
        "subnormal",
        "over_fp16",
        "first_nonfinite",
        "absmax",
        "min_nonzero",
    ):
        assert getattr(got, k) == getattr(want, k), k
    assert got.sum == pytest.approx(want.sum, rel=1e-4, abs=1e-3)


@pytest.mark.parametrize("launch", ["table", "each"])
def test_segments_grow_without_losing_rows(monkeypatch, launch):
    monkeypatch.setattr(sink_mod, "CHUNK", 4)  # segments of 4, 8, 16 rows
    s = sink_mod.StatsSink(DEV, backend="triton", launch=launch)
    ts = _tensors(23)
    rows = s.measure_many(ts[:3]) + s.measure_many(ts[3:10]) + s.measure_many(ts[10:])  # 3|7 straddles 4
    assert rows == list(range(23))
    assert [(seg.start, seg.cap) for seg in s._segments] == [(0, 4), (4, 8), (12, 16)]
    got = s.rows()
    assert len(got) == 23
    for t, r in zip(ts, got):
        _same(r, _want(t))
    assert s.bytes_read == sum(t.numel() * t.element_size() for t in ts)


def test_already_measured_tensor_is_not_read_again():
    s = sink_mod.StatsSink(DEV, backend="triton")
    a, b = torch.ones(8, device=DEV), torch.zeros(8, device=DEV)
    assert s.measure_many([a, b, a]) == [0, 1, 0]
    assert s.measure(b) == 1
    assert s.bytes_read == 64
    a.add_(1)  # changed in place since: measured again
    assert s.measure(a) == 2
    assert s.rows()[2].absmax == 2.0


def test_launchers_agree():
    ts = _tensors(9)
    a = sink_mod.StatsSink(DEV, backend="triton", launch="table")
    b = sink_mod.StatsSink(DEV, backend="triton", launch="each")
    a.measure_many(ts)
    b.measure_many(ts)
    for x, y in zip(a.rows(), b.rows()):
        assert (x.nan, x.posinf, x.neginf, x.first_nonfinite, x.absmax) == (
            y.nan,
            y.posinf,
            y.neginf,
            y.first_nonfinite,
            y.absmax,
        )


def test_bad_launch_mode():
    with pytest.raises(ValueError, match="launch must be"):
        sink_mod.StatsSink(DEV, backend="triton", launch="graph")


def test_triton_backend_on_cpu_needs_the_interpreter(monkeypatch):
    """Compiled Triton kernels cannot read host memory (found on the first GPU run: CPU tensors
    reached a compiled kernel); the sink refuses that with a clear message instead."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="reads CUDA tensors"):
        sink_mod.StatsSink("cpu", backend="triton")
    with pytest.raises(ValueError, match="backend must be"):
        sink_mod.StatsSink("cpu", backend="cuda")
    assert sink_mod.StatsSink("cpu").backend == "reference"


def test_new_segment_rows_hold_the_starting_row():
    """What the table launcher with init=False relies on: a fresh segment's rows are exactly what
    the init kernel writes, so an empty tensor's row and a never-written row read the same."""
    seg = sink_mod.Segment.new(0, 3, torch.device(DEV))
    from nan_hunter.kernels import triton as tk

    ints, floats = seg.ints.clone(), seg.floats.clone()
    tk.stats_each_into([torch.empty(0, device=DEV)] * 3, seg.ints, seg.floats, 0)
    assert torch.equal(seg.ints, ints) and torch.equal(seg.floats, floats)
    s = TensorStats.from_row(seg.ints[0].tolist(), seg.floats[0].tolist())
    assert (s.numel, s.nan, s.first_nonfinite, s.absmax) == (0, 0, None, 0.0)


def test_tensors_the_kernel_cannot_read_go_to_the_reference():
    """float64 and tensor subclasses are measured by the torch reference into the same rows,
    in the same batch as kernel-readable tensors; nothing raises into the user's forward."""

    class Tagged(torch.Tensor):
        pass

    s = sink_mod.StatsSink(DEV, backend="triton")
    x64 = torch.tensor([1.0, float("nan"), -3.0], dtype=torch.float64, device=DEV)
    sub = torch.tensor([2.0, float("inf")], device=DEV).as_subclass(Tagged)
    plain = torch.tensor([5.0, -7.0], device=DEV)
    assert s.measure_many([plain, x64, sub]) == [0, 1, 2]
    got = s.rows()
    for t, r in zip([plain, x64, sub], got):
        _same(r, _want(torch.Tensor(t) if isinstance(t, Tagged) else t))
    assert got[1].nan == 1 and got[2].posinf == 1 and s.unmeasured == []


def test_eager_and_graph_rows_never_share_a_segment(monkeypatch):
    """Segment bookkeeping around a CUDA-graph capture, with the capture flag forced on CPU (the
    real capture runs in tests/kernels/test_capture_gpu.py): rows measured while capturing go
    to a graph segment of their own, eager rows after it to a new eager segment, and the rows
    skipped in between read as empty tensors."""
    if DEV == "cuda":
        pytest.skip(
            "a forced capture flag on a real GPU takes the spare-segment path; the real capture is "
            "tests/kernels/test_capture_gpu.py"
        )
    monkeypatch.setattr(sink_mod, "CHUNK", 4)
    s = sink_mod.StatsSink(DEV, backend="triton")
    ts = _tensors(7)
    assert s.measure_many(ts[:2]) == [0, 1]
    monkeypatch.setattr(sink_mod, "_capturing", lambda device: True)
    assert s.measure_many(ts[2:4]) == [4, 5]  # rows 2-3 (rest of the eager segment) skipped
    assert s.graph_rows
    monkeypatch.setattr(sink_mod, "_capturing", lambda device: False)
    assert s.measure_many(ts[4:]) == [12, 13, 14]  # the graph segment (rows 4-11) is left alone
    assert [(g.start, g.cap, g.graph) for g in s._segments] == [(0, 4, False), (4, 8, True), (12, 16, False)]
    assert s._segments[1] in sink_mod._GRAPH_SEGMENTS
    got = s.rows()
    for t, r in zip(ts, [0, 1, 4, 5, 12, 13, 14]):
        _same(got[r], _want(t))
    for r in [2, 3, *range(6, 12)]:
        assert (got[r].numel, got[r].nan, got[r].first_nonfinite) == (0, 0, None)
