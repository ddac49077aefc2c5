"""The overflow forecast from sampled signals: what shrinks, against which dtypes, in what order."""

from __future__ import annotations

import math

import pytest

from nan_hunter.capture.signals import ABSMAX, ATTENTION, LOGSUMEXP, Signals
from nan_hunter.dtypes import limits
from nan_hunter.forecast.fit import level_db
from nan_hunter.forecast.overflow import forecast, signal_level


def _signals(series: dict) -> Signals:
    s = Signals()
    for (module, signal), pts in series.items():
        for step, v in pts:
            s.add(module, signal, step, v)
    s.steps = sorted({st for pts in series.values() for st, _ in pts})
    return s


def test_nothing_sampled_is_null_and_nothing_shrinking_is_empty():
    assert forecast(None, "fp16", ("bf16",), 8) is None
    assert forecast(Signals(), "fp16", ("bf16",), 8) is None
    flat = _signals({("layers.0", ABSMAX): [(s, 10.0) for s in range(1, 20, 2)]})
    assert forecast(flat, "fp16", ("bf16",), 8) == []


def test_a_doubling_block_is_forecast_against_each_dtype():
    grow = _signals(
        {
            ("layers.0", ABSMAX): [(s, 100.0 * 2 ** (s / 10)) for s in range(1, 60, 2)],
            ("layers.1", ABSMAX): [(s, 5.0) for s in range(1, 60, 2)],
        }
    )
    fc = forecast(grow, "fp16", ("bf16", "fp8-e4m3", "fp16"), 8)
    assert {e["dtype"] for e in fc} == {"fp16", "bf16", "fp8-e4m3"} and len(fc) == 3
    assert all(e["module"] == "layers.0" and e["signal"] == ABSMAX for e in fc)
    by = {e["dtype"]: e for e in fc}
    last = 100.0 * 2 ** (59 / 10)
    assert by["fp16"]["headroom_db"] == pytest.approx(level_db(65504.0) - level_db(last), abs=0.01)
    assert by["fp16"]["rate_db_per_100_steps"] == pytest.approx(-60.206, abs=0.01)
    # 35 steps past the latest point, 2.5 fitted spans (steps 45-59): a projection, at most "medium"
    assert by["fp16"]["projected_step"] == 94 and by["fp16"]["confidence"] == "medium"
    # bf16's max is ~470 dB away: far past three spans, so not projected ("low")
    assert by["bf16"]["projected_step"] is None and by["bf16"]["confidence"] == "low"
    assert by["fp8-e4m3"]["projected_step"] == 59  # past 448 already: crossed at the latest sampled step
    assert [e["dtype"] for e in fc] == ["fp8-e4m3", "fp16", "bf16"]  # soonest crossing first


def test_logsumexp_level_is_that_of_z():
    assert signal_level(LOGSUMEXP, math.log(65504.0)) == pytest.approx(level_db(65504.0))
    assert signal_level(ATTENTION, 100.0) == pytest.approx(40.0)


def test_run_dtype_comes_first_and_defaults_to_fp32():
    grow = _signals({("", LOGSUMEXP): [(s, 5.0 + 0.1 * s) for s in range(1, 30, 2)]})
    fc = forecast(grow, None, ("fp16",), 8)
    assert {e["dtype"] for e in fc} == {"fp32", "fp16"}
    fp32 = next(e for e in fc if e["dtype"] == "fp32")
    assert fp32["headroom_db"] == pytest.approx(
        level_db(limits("fp32").max) - signal_level(LOGSUMEXP, 7.9), abs=0.01
    )


def test_a_window_of_zero_fits_nothing():
    grow = _signals({("layers.0", ABSMAX): [(s, 100.0 * 2 ** (s / 10)) for s in range(1, 60, 2)]})
    assert forecast(grow, "fp16", (), 0) == []
