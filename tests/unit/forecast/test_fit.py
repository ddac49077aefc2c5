"""The line through a signal's level in dB: growing, flat and noisy series."""

from __future__ import annotations

import math
import random

import pytest

from nan_hunter.forecast.fit import fit, level_db


def test_level_db_is_twenty_log10():
    assert level_db(10.0) == pytest.approx(20.0)
    assert level_db(2.0) == pytest.approx(6.0206, abs=1e-4)
    assert level_db(0.0) == -math.inf


def test_steady_growth_is_rising_with_high_confidence_and_a_projected_crossing():
    # +6.02 dB every 10 steps (x2), from 100 at step 0: 65504 is reached at step 10*log2(655.04) = 93.6
    pts = [(s, level_db(100.0 * 2 ** (s / 10))) for s in range(0, 60, 10)]
    tr = fit(pts)
    assert tr.rising and tr.confidence == "high" and tr.r2 == pytest.approx(1.0)
    assert tr.slope == pytest.approx(0.60206, rel=1e-6)
    assert tr.crossing(level_db(65504.0)) == 94


def test_flat_series_does_not_rise_and_projects_nothing():
    tr = fit([(s, 40.0) for s in range(0, 80, 10)])
    assert not tr.rising and tr.confidence == "low" and tr.crossing(96.3) is None


@pytest.mark.parametrize("seed", range(5))
def test_noise_around_a_flat_level_is_not_growth(seed):
    rng = random.Random(seed)
    tr = fit([(s, 40.0 + rng.gauss(0, 3)) for s in range(0, 16, 2)])
    assert tr.confidence == "low" or not tr.rising or tr.t >= 2  # rising only when the slope beats its error
    if not tr.rising:
        assert tr.crossing(96.3) is None


def test_noisy_growth_has_lower_confidence_than_clean_growth():
    rng = random.Random(1)
    clean = fit([(s, 20.0 + 0.5 * s) for s in range(0, 8, 2)])
    noisy = fit([(s, 20.0 + 0.5 * s + rng.gauss(0, 4)) for s in range(0, 8, 2)])
    order = {"low": 0, "medium": 1, "high": 2}
    assert order[noisy.confidence] <= order[clean.confidence]


def test_already_crossed_projects_the_latest_step():
    tr = fit([(s, 90.0 + s) for s in range(0, 12, 2)])
    assert tr.crossing(95.0) == 10


@pytest.mark.parametrize(
    "name, pts",
    [
        ("two points", [(0, 1.0), (1, 2.0)]),
        ("one step", [(3, 1.0), (3, 2.0), (3, 3.0)]),
        ("non-finite left out", [(0, 1.0), (1, math.inf), (2, math.nan)]),
    ],
)
def test_too_little_to_fit(name, pts):
    assert fit(pts) is None


def test_a_projection_far_beyond_the_fitted_span_is_lowered_then_dropped():
    """A clean line through steps 100-170 (a clean run's early drift): one span ahead keeps "high",
    two spans "medium", past three spans "low" and no projected step (the tryout's clean run
    projected step 1,132 from 80 steps of data with "high")."""
    tr = fit([(s, 20.0 + 0.1 * s) for s in range(100, 171, 10)])
    assert tr.confidence == "high" and tr.first_step == 100 and tr.last_step == 170
    assert tr.confidence_at(230) == "high" and tr.confidence_at(300) == "medium"
    assert tr.confidence_at(400) == "low"
    assert tr.projection(20.0 + 0.1 * 1000) == 1000 and tr.crossing(20.0 + 0.1 * 1000) is None
    assert tr.crossing(20.0 + 0.1 * 300) == 300
