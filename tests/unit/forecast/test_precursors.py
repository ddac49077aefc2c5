"""The precursor rules on synthetic sampled signals: each fires on its shape, with its evidence
and fix, and stays silent on flat, noisy or small series."""

from __future__ import annotations

import random

import pytest

from nan_hunter.capture.signals import ATTENTION, LOGSUMEXP, AdamState, Signals
from nan_hunter.config import default_config
from nan_hunter.forecast.precursors import RULES, History, PrecursorWatch

CFG = default_config().precursors
STEPS = list(range(1, 41, 2))


def _signals(series: dict | None = None, grads: list | None = None, adam: list | None = None) -> Signals:
    s = Signals()
    for (module, signal), pts in (series or {}).items():
        for step, v in pts:
            s.add(module, signal, step, v)
    s.grad_norms = list(grads or [])
    s.adam = list(adam or [])
    s.steps = STEPS
    return s


def _warn(signals: Signals) -> list:
    return PrecursorWatch(CFG).update(signals)


def test_registry_names_the_four_codes():
    assert set(RULES) == {
        "attention_logit_growth",
        "output_logit_divergence",
        "update_collapse",
        "grad_norm_spike",
    }


def test_growing_attention_logits_warn_once_past_the_floor_with_the_fix():
    # x1.5 every sampled step from 2: past the floor (30) at step 15
    sig = _signals({("layers.0.attn", ATTENTION): [(s, 2.0 * 1.5 ** (s // 2)) for s in STEPS]})
    ws = _warn(sig)
    assert [w.code for w in ws] == ["attention_logit_growth"]
    w = ws[0]
    assert w.module == "layers.0.attn" and w.step == 15 and "qk-layernorm" in w.fix
    assert "max |q·k|/√d" in w.evidence[0] and "dB" in w.evidence[1]


@pytest.mark.parametrize(
    "name, values",
    [
        ("flat above the floor", lambda s, r: 200.0),
        ("noisy around a level", lambda s, r: 100.0 * (1 + 0.3 * r.uniform(-1, 1))),
        ("growing below the floor", lambda s, r: 0.5 * 1.1 ** (s // 2)),
    ],
)
def test_attention_logits_that_do_not_grow_past_the_floor_are_silent(name, values):
    r = random.Random(0)
    assert _warn(_signals({("attn", ATTENTION): [(s, values(s, r)) for s in STEPS]})) == []


def test_drifting_log_z_warns_with_the_z_loss_coefficient():
    sig = _signals({("", LOGSUMEXP): [(s, 10.0 + 0.5 * s) for s in STEPS]})
    ws = _warn(sig)
    assert [w.code for w in ws] == ["output_logit_divergence"]
    assert ws[0].module is None and ws[0].step == 21 and f"{CFG.z_loss:g}·log²Z" in ws[0].fix


def test_update_collapse_when_eps_exceeds_most_second_moment_roots():
    sig = _signals(adam=[AdamState(s, 0.9 if s >= 21 else 0.0, 1e-8, 1e-9) for s in STEPS])
    ws = _warn(sig)
    assert [(w.code, w.step) for w in ws] == [("update_collapse", 21)]
    assert "90.0%" in ws[0].evidence[0] and "smaller eps" in ws[0].fix


def test_grad_norm_spike_against_the_runs_own_median():
    grads = [(s, 1.0 + 0.1 * (s % 3)) for s in STEPS]
    grads[12] = (grads[12][0], 50.0)
    ws = _warn(_signals(grads=grads))
    assert [(w.code, w.step) for w in ws] == [("grad_norm_spike", grads[12][0])]
    assert "× the median" in ws[0].evidence[0]
    assert _warn(_signals(grads=[(s, 1.0 + 0.1 * (s % 3)) for s in STEPS])) == []


def test_history_hides_later_points_and_a_pending_step_waits():
    sig = _signals({("", LOGSUMEXP): [(s, 10.0 + 0.5 * s) for s in STEPS]})
    h = History(sig, 9)
    assert [p[0] for _, pts in h.series(LOGSUMEXP) for p in pts] == [1, 3, 5, 7, 9]
    pw = PrecursorWatch(CFG)
    assert pw.update(sig, before=21) == [] and pw.upto == 19
    assert [w.step for w in pw.update(sig)] == [21]
    assert pw.update(sig) == []  # raised once
