"""Issue 46, item 5: the overflow forecast and the precursor warnings on real training runs, on CPU.

Tiny Llama and Qwen3 models (``tests/models/diverging_lm.py``) trained under fp16 autocast with
AdamW, as Wortsman et al. (2023) probe instabilities at small scale:

- at lr 0.1 the Llama diverges: a precursor warning (attention_logit_growth) comes at least one
  step before the first non-finite loss, and the forecast projects the fp16 crossing before it too;
- the mitigated run (Qwen3's qk-layernorm, z-loss 1e-4·log²Z) at the same learning rate raises no
  warning; where it still overflows fp16 (the residual stream grows at that rate whatever the
  attention does) the forecast has projected that crossing before the NaN;
- a clean run at lr 1e-3 stays finite and raises no warning.

The default slice runs seeds 0 and 1; ``NANHUNTER_FULL_MATRIX=1`` adds seeds 2 and 3. The leads
per seed are in benchmarks/2026-11-28-forecast.md (``bench/forecast_lead.py``)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers")

from models.diverging_lm import train  # noqa: E402  (tests/ is on sys.path)

FULL = os.environ.get("NANHUNTER_FULL_MATRIX") == "1"
SEEDS = [
    pytest.param(
        s,
        marks=[]
        if s < 2
        else [
            pytest.mark.matrix_full,
            pytest.mark.skipif(not FULL, reason="full matrix: NANHUNTER_FULL_MATRIX=1"),
        ],
    )
    for s in range(4)
]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("seed", SEEDS)
def test_diverging_run_is_warned_and_forecast_before_its_first_nan(seed):
    r = train("llama", 0.1, seed, steps=160)
    assert r.nan_step is not None and r.watch_step == r.nan_step
    assert r.lead(r.first_warning) >= 1, r.warnings
    assert "attention_logit_growth" in {w["code"] for w in r.warnings}
    first = min(r.warnings, key=lambda w: w["step"])
    assert first["evidence"] and first["fix"] and first["module"].endswith("self_attn")
    assert r.forecast_step is not None and r.lead(r.forecast_step) >= 1
    assert r.last_projected is not None and abs(r.last_projected - r.nan_step) <= 10
    assert r.lead(r.first_accurate()) >= 1  # projections name the NaN's step (±10 %) before it comes


@pytest.mark.parametrize("seed", SEEDS)
def test_mitigated_run_raises_no_warning(seed):
    r = train("qwen3", 0.1, seed, z_loss=1e-4, steps=120)
    assert r.warnings == []
    if r.nan_step is not None:  # overflowed fp16 all the same: the forecast saw it coming
        assert r.forecast_step is not None and r.lead(r.forecast_step) >= 1
        assert abs(r.last_projected - r.nan_step) <= 10


@pytest.mark.parametrize("seed", SEEDS)
def test_clean_run_raises_no_warning(seed):
    r = train("llama", 1e-3, seed, steps=80)
    assert r.nan_step is None and r.watch_step is None
    assert r.warnings == []
