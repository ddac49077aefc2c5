"""capture/sink.py on the host: the rows a watched forward writes through ``measure_host`` (one
``aminmax`` into a reused buffer, rows reused from a pool) are the rows ``quick_row``/``full_row``
give, bit for bit, whatever the tensor; rows given back are reused and counted."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from nan_hunter.capture.sink import StatsSink
from nan_hunter.kernels import reference as ref


def _expected(t: torch.Tensor) -> tuple[list[int], list[float]]:
    q = ref.quick_row(t)
    if q is None:
        ints, floats = ref.full_row(t)
        q = (ints.tolist(), floats.tolist())
    return q


def _same(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> bool:
    """Equal rows, NaN where NaN and the sign of zero kept (repr tells -0.0 from 0.0)."""
    return a[0] == b[0] and [repr(x) for x in a[1]] == [repr(x) for x in b[1]]


def _grad_leaf() -> torch.Tensor:
    return torch.tensor([1.0, -3.0], requires_grad=True)


CASES = [
    ("fp32", lambda: torch.randn(4, 8)),
    ("fp16", lambda: torch.randn(3, 5).half() * 100),
    ("bf16", lambda: torch.randn(3, 5).bfloat16()),
    ("fp64", lambda: torch.randn(6, dtype=torch.float64)),
    ("negative zeros only", lambda: torch.full((3,), -0.0)),
    ("zero and negative zero", lambda: torch.tensor([-0.0, 0.0])),
    ("all negative", lambda: torch.tensor([-5.0, -2.0])),
    ("above fp16 and bf16 range", lambda: torch.tensor([1e5, -3e38])),
    ("nan", lambda: torch.tensor([1.0, math.nan])),
    ("+inf", lambda: torch.tensor([math.inf, 2.0])),
    ("-inf fp16", lambda: torch.tensor([-math.inf, 2.0]).half()),
    ("empty", lambda: torch.empty(0, 3)),
    ("0-dim", lambda: torch.tensor(7.5)),
    ("non-contiguous", lambda: torch.randn(6, 4).t()),
    ("requires grad", _grad_leaf),
    ("fp8 (the general way)", lambda: torch.randn(4).to(torch.float8_e4m3fn)),
    ("subclass (the general way)", lambda: torch.randn(3).as_subclass(type("Sub", (torch.Tensor,), {}))),
]


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_host_rows_are_the_reference_rows(name, make):
    t = make()
    sink = StatsSink("cpu", underflow=False)
    new: list[int] = []
    ((label, row),) = sink.measure_host([("x", t)], True, new)
    assert label == "x" and new == [row]
    assert _same(sink.host_table()[row], _expected(t))
    assert (row in sink.bad_rows) == any(_expected(t)[0][1:4])  # nan, posinf, neginf


def test_inference_tensors_and_inference_mode():
    sink = StatsSink("cpu", underflow=False)
    with torch.inference_mode():
        t = torch.randn(5)
        refs = sink.measure_host([("a", t), ("b", t)])  # no version counter: never reused, two rows
    assert refs[0][1] != refs[1][1]
    assert _same(sink.host_table()[refs[0][1]], _expected(t))
    u = torch.randn(5)
    ((_, r),) = sink.measure_host([("c", u)])  # the buffers were made outside inference mode: still usable
    assert _same(sink.host_table()[r], _expected(u))


def test_identity_cache_and_row_reuse():
    sink = StatsSink("cpu", underflow=False)
    a, b = torch.randn(3), torch.randn(3)
    new: list[int] = []
    refs = sink.measure_host([("a", a), ("b", b), ("a again", a)], True, new)
    assert refs[0][1] == refs[2][1] and len(new) == 2
    a.add_(1)  # changed in place: measured again
    ((_, r),) = sink.measure_host([("a", a)], True, new)
    assert r not in (refs[0][1], refs[1][1]) and _same(sink.host_table()[r], _expected(a))
    assert sink.rows_in_use == 3
    sink.free(new)
    assert sink.rows_in_use == 0
    sink.forget_tensors()
    c = torch.tensor([math.nan])
    ((_, r),) = sink.measure_host([("c", c)])
    assert r in new and r in sink.bad_rows and sink.n == 3  # a row given back, no new one
    sink.free([r])
    assert not sink.bad_rows


def test_another_thread_takes_the_general_way():
    sink = StatsSink("cpu", underflow=False)
    t = torch.randn(4, 4)
    out: list = []
    th = threading.Thread(target=lambda: out.append(sink.measure_host([("t", t)])))
    th.start()
    th.join()
    ((_, r),) = out[0]
    assert _same(sink.host_table()[r], _expected(t))


def test_underflow_sinks_keep_the_full_quick_row():
    sink = StatsSink("cpu", underflow=True)
    t = torch.tensor([1e-30, 2.0])
    ((_, r),) = sink.measure_host([("t", t)])
    assert _same(sink.host_table()[r], ref.quick_row(t, underflow=True))
