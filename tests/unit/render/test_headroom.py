"""render/headroom.py: the headroom strip as data — where each call's output absmax sits between
``FLOOR`` and the run dtype's max on a log scale, the producer kept with its lead, the rest
collapsed into gaps, and the abs-min and flush-to-zero columns."""

from __future__ import annotations

import math

import pytest

from nan_hunter.render.headroom import (
    CONTEXT,
    FLOOR,
    StripCall,
    absmin_text,
    flush_dtype,
    flush_text,
    fraction,
    pick_rows,
    strip,
)
from nan_hunter.report import FirstNonfinite, Report, RunInfo

from .reports import clean, overflow


def _row(absmax: float | None, posinf: int = 0, nan: int = 0, **kw) -> dict:
    return {
        "module": kw.pop("module", "m"),
        "module_type": "Linear",
        "call_index": 0,
        "input_index": 0,
        "depth": 1,
        "absmax": absmax,
        "in_absmax": 1.0,
        "nan": nan,
        "posinf": posinf,
        "neginf": 0,
        **kw,
    }


def test_the_overflow_report_strip():
    s = strip(overflow())
    assert (s.run_dtype, s.dtype, s.max, s.calls, s.flush_dtype) == ("fp16", "fp16", 65504.0, 3, "fp16")
    up, down, root = s.items
    assert (up.module, up.tone, up.absmax, up.headroom, up.producer) == ("up", "ok", "4", "1.64e+04x", False)
    assert up.fill == pytest.approx(
        (math.log10(4) - math.log10(FLOOR)) / (math.log10(65504) - math.log10(FLOOR))
    )
    assert (down.module, down.tone, down.absmax, down.headroom, down.fill, down.producer) == (
        "down",
        "bad",
        "+inf",
        "—",
        1.0,
        True,
    )
    assert root.module == "<root>" and not root.producer
    assert s.title == "headroom per module call (3 calls, fp16 max 65504; bar from 0.0001 to the max)"
    assert s.has_absmin


@pytest.mark.parametrize(
    "name, absmax, tone, headroom",
    [
        ("empty output", 0.0, "empty", "∞"),
        ("tiny, below the floor", 1e-9, "ok", "6.55e+13x"),
        ("1% of max", 655.04, "close", "100x"),
        ("half of max", 32752.0, "tight", "2x"),
        ("at max", 65504.0, "tight", "1x"),
    ],
)
def test_tones(name, absmax, tone, headroom):
    rep = Report(run=RunInfo("fp16", "cpu", 1), modules=[_row(absmax)])
    (call,) = strip(rep).items
    assert (call.tone, call.headroom) == (tone, headroom)
    assert 0.0 <= call.fill <= 1.0


def test_an_fp8_run_is_bounded_by_its_compute_dtype():
    s = strip(Report(run=RunInfo("fp8-e4m3", "cpu", 1), modules=[_row(2.0)]))
    assert (s.run_dtype, s.dtype, s.flush_dtype) == ("fp8-e4m3", "bf16", "bf16")
    assert "fp8-e4m3 run, activations in bf16" in s.title


def test_no_module_rows_no_strip():
    assert strip(Report()) is None and strip(Report(modules=[])) is None


def test_long_runs_keep_the_producer_its_lead_and_the_tightest():
    rows = [_row(1.0 + i / 1000, module=f"l{i}") for i in range(100)]  # later calls slightly larger
    rows[10]["absmax"] = 60000.0  # the tightest finite call
    rows[70].update(absmax=0.0, posinf=1)
    rep = Report(
        run=RunInfo("fp16", "cpu", 1),
        modules=rows,
        first_nonfinite=FirstNonfinite(0, "l70", "Linear", None, "posinf", "producer"),
    )
    s = strip(rep, max_rows=8)
    # the producer and its CONTEXT calls before it, then by headroom: l10, then the largest of the rest
    assert CONTEXT == 4
    assert [it.module if isinstance(it, StripCall) else it.calls for it in s.items] == [
        10,
        "l10",
        55,
        "l66",
        "l67",
        "l68",
        "l69",
        "l70",
        27,
        "l98",
        "l99",
    ]
    assert [it.producer for it in s.items if isinstance(it, StripCall)] == [False] * 5 + [True, False, False]
    assert s.items[0].text == "⋮ 10 call(s), absmax ≤ 1.01"  # 1.009, 3 significant digits
    falling = [_row(50.0 - i, module=f"f{i}") for i in range(50)]  # no producer: the three largest, first
    tail = strip(Report(run=RunInfo("fp16", "cpu", 1), modules=falling), max_rows=3)
    assert [getattr(it, "module", None) for it in tail.items] == ["f0", "f1", "f2", None]
    assert tail.items[-1].text == "⋮ 47 more call(s)"


def test_pick_rows_shows_everything_that_fits():
    assert pick_rows([_row(1.0)] * 3, 65504.0, None, 40) == [0, 1, 2]


@pytest.mark.parametrize(
    "row, want",
    [
        (_row(3.0), 3.0 / 6.0),
        (_row(0.0, posinf=1), math.inf),
        (_row(None), 0.0),
    ],
)
def test_fraction(row, want):
    assert fraction(row, 6.0) == want


@pytest.mark.parametrize(
    "compute, want", [("fp16", "fp16"), ("bf16", "bf16"), ("fp32", "fp16"), ("fp8-e4m3", "fp8-e4m3")]
)
def test_flush_dtype(compute, want):
    assert flush_dtype(compute) == want


@pytest.mark.parametrize(
    "frac, text", [(None, "—"), (0.0, "0"), (0.0004, "<0.1%"), (0.05, "5.0%"), (0.5, "50%")]
)
def test_flush_text(frac, text):
    row = _row(1.0, flush_frac=None if frac is None else {"fp16": frac})
    assert flush_text(row, "fp16") == text


@pytest.mark.parametrize(
    "min_nonzero, sub, text", [(None, None, "—"), (0.001, None, "0.001"), (6e-8, 0.25, "6e-08 (25% sub)")]
)
def test_absmin_text(min_nonzero, sub, text):
    assert absmin_text(_row(1.0, min_nonzero=min_nonzero, subnormal_frac=sub)) == text


def test_several_inputs_name_their_input():
    rows = [_row(1.0), {**_row(2.0), "input_index": 1}]
    items = strip(Report(run=RunInfo("fp32", "cpu", 2), modules=rows)).items
    assert [it.input_index for it in items] == [0, 1]
    assert [it.input_index for it in strip(clean()).items] == [None, None, None]  # one input: not said
