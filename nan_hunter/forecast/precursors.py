"""Named precursors of a training instability (report field ``warnings``): one rule class per
code, registered in ``RULES``; each reads the sampled signals up to a step and says what it sees,
with the evidence and the fix. A warning is never a fault: it changes no exit code and triggers no
``on_fault``.

Rules are judged at every sampled step in order, each seeing only the history up to that step, so
a warning's ``step`` is the sampled step at which it would have been raised live; a code is raised
once per module (``PrecursorWatch``). Thresholds: ``configs/default.yaml``, section ``precursors``,
with their sources (Wortsman et al. 2023, arXiv 2309.14322; Dehghani et al. 2023; PaLM's z-loss).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ..capture.signals import ATTENTION, LOGSUMEXP, AdamState, Signals
from ..config import PrecursorsConfig, default_config
from .fit import Trend, fit, level_db


@dataclass(frozen=True)
class Precursor:
    """One warning (contract v1.4 ``warnings`` entry)."""

    code: str
    step: int
    module: str | None
    evidence: list[str]
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class History:
    """The sampled signals as they stood at ``step`` (points after it hidden)."""

    def __init__(self, signals: Signals, step: int) -> None:
        self.signals, self.step = signals, step

    def _upto(self, pts: list) -> list:
        return pts[: bisect.bisect_right([p[0] for p in pts], self.step)]

    def series(self, signal: str) -> list[tuple[str, list[tuple[int, float]]]]:
        """(module, points up to ``step``) of every module with that signal, points at ``step`` only."""
        out = []
        for (module, sig), pts in self.signals.series.items():
            if sig == signal:
                pts = self._upto(pts)
                if pts and pts[-1][0] == self.step:
                    out.append((module, pts))
        return out

    def grad_norms(self) -> list[tuple[int, float]]:
        return self._upto(self.signals.grad_norms)

    def adam(self) -> AdamState | None:
        a = [x for x in self.signals.adam if x.step == self.step]
        return a[-1] if a else None


class PrecursorRule(Protocol):
    """A precursor: its ``code`` and what it sees in the history (an empty list: nothing)."""

    code: str

    def check(self, history: History, cfg: PrecursorsConfig) -> list[Precursor]: ...


RULES: dict[str, PrecursorRule] = {}


def register(rule: type[PrecursorRule]) -> type[PrecursorRule]:
    """Class decorator: one instance of ``rule`` in ``RULES`` under its ``code``."""
    made = rule()
    RULES[made.code] = made
    return rule


def _growth(pts: list[tuple[int, float]], level: Any, window: int) -> Trend | None:
    return fit([(s, level(v)) for s, v in pts[-window:]] if window > 0 else [])


def _rise(trend: Trend, pts: list[tuple[int, float]], window: int) -> float:
    """The fitted rise over the window's span of steps."""
    span = pts[-1][0] - pts[-min(window, len(pts))][0]
    return trend.slope * span


@dataclass(frozen=True)
class _Rising:
    """A series' latest value past its floor, with a fitted rise past its threshold over the window."""

    value: float
    trend: Trend
    rise: float
    first: tuple[int, float]  # the window's first point


def _rising_past(
    pts: list[tuple[int, float]], level: Any, window: int, floor: float, min_rise: float
) -> _Rising | None:
    """The shape both logit rules share: the latest value at least ``floor``, the level (``level``)
    rising over the latest ``window`` points by at least ``min_rise``; None otherwise."""
    v = pts[-1][1]
    trend = _growth(pts, level, window)
    if trend is None or v < floor or not trend.rising:
        return None
    rise = _rise(trend, pts, window)
    if rise < min_rise:
        return None
    return _Rising(v, trend, rise, pts[-min(window, len(pts))])


@register
class AttentionLogitGrowth:
    """The largest pre-softmax attention logit grows steadily past a floor: the attention entropy
    collapses towards one-hot and the logits head for overflow (Dehghani et al. 2023; reproduced
    at small scale by Wortsman et al. 2023, §3.1)."""

    code = "attention_logit_growth"

    def check(self, history: History, cfg: PrecursorsConfig) -> list[Precursor]:
        out = []
        for module, pts in history.series(ATTENTION):
            r = _rising_past(pts, level_db, cfg.window, cfg.attention_logit_min, cfg.attention_rise_db)
            if r is None:
                continue
            v, trend, rise, first = r.value, r.trend, r.rise, r.first
            out.append(
                Precursor(
                    self.code,
                    history.step,
                    module,
                    [
                        f"max |q·k|/√d = {v:.4g} at step {history.step} (floor {cfg.attention_logit_min:g})",
                        f"rising {rise:+.1f} dB over steps {first[0]}..{history.step} (from {first[1]:.4g}), "
                        f"{trend.n} sampled points, R² {trend.r2:.2f}",
                    ],
                    "qk-layernorm (normalise q and k per head before q·kᵀ), or cap the logits "
                    "(soft-capping c·tanh(s/c) before the softmax)",
                )
            )
        return out


@register
class OutputLogitDivergence:
    """``|log Z|`` of the output logits drifts away from 0 past a floor: the logits diverge from
    log-probabilities (Wortsman et al. 2023, §3.2); PaLM's z-loss keeps ``log Z`` near 0."""

    code = "output_logit_divergence"

    def check(self, history: History, cfg: PrecursorsConfig) -> list[Precursor]:
        out = []
        for module, pts in history.series(LOGSUMEXP):
            r = _rising_past(pts, float, cfg.window, cfg.logz_min, cfg.logz_rise)
            if r is None:
                continue
            v, trend, rise, first = r.value, r.trend, r.rise, r.first
            out.append(
                Precursor(
                    self.code,
                    history.step,
                    module or None,
                    [
                        f"max |log Z| = {v:.4g} at step {history.step} (floor {cfg.logz_min:g}), log Z = logsumexp(logits)",
                        f"drifting {rise:+.2f} over steps {first[0]}..{history.step} (from {first[1]:.4g}), "
                        f"{trend.n} sampled points, R² {trend.r2:.2f}",
                    ],
                    f"z-loss: add {cfg.z_loss:g}·log²Z (mean over positions) to the loss (PaLM), which pulls log Z back to 0",
                )
            )
        return out


@register
class UpdateCollapse:
    """AdamW's ε exceeds the root of the second moment for most elements: the update
    ``m̂/(√v̂+ε)`` is set by ε, not the gradient, and collapses (Wortsman et al. 2023, §3.4)."""

    code = "update_collapse"

    def check(self, history: History, cfg: PrecursorsConfig) -> list[Precursor]:
        a = history.adam()
        if a is None or a.below_eps < cfg.update_collapse_fraction:
            return []
        return [
            Precursor(
                self.code,
                history.step,
                None,
                [
                    f"{100 * a.below_eps:.1f}% of the optimizer's elements have √v̂ < eps = {a.eps:g} at step {history.step} "
                    f"(threshold {100 * cfg.update_collapse_fraction:g}%)",
                    f"median parameter RMS √v̂ = {a.median_root:.3g}: those elements' updates shrink by up to √v̂/(√v̂+eps)",
                ],
                f"a smaller eps (e.g. {min(a.eps, a.median_root) / 100:.1g}, or 1e-15 as Wortsman et al. use), "
                "below the gradients' RMS",
            )
        ]


@register
class GradNormSpike:
    """The gradients' global norm jumps far above the run's own recent history (a loss spike's
    signature; Wortsman et al. 2023 follow the gradient norm's scaling before an instability)."""

    code = "grad_norm_spike"

    def check(self, history: History, cfg: PrecursorsConfig) -> list[Precursor]:
        pts = history.grad_norms()
        if len(pts) <= cfg.grad_spike_history or pts[-1][0] != history.step:
            return []
        before = [v for _, v in pts[-cfg.grad_spike_history - 1 : -1]]
        med = statistics.median(before)
        v = pts[-1][1]
        if med <= 0 or v < cfg.grad_spike_factor * med:
            return []
        return [
            Precursor(
                self.code,
                history.step,
                None,
                [
                    f"gradient norm {v:.4g} at step {history.step} is {v / med:.1f}× the median {med:.4g} of the "
                    f"{len(before)} sampled steps before it (threshold {cfg.grad_spike_factor:g}×)"
                ],
                "clip the gradient norm, lower the learning rate or lengthen its warm-up; inspect that step's batch",
            )
        ]


@dataclass
class PrecursorWatch:
    """The rules judged at each new sampled step, in order; each (code, module) raised once."""

    cfg: PrecursorsConfig = field(default_factory=lambda: default_config().precursors)
    found: list[Precursor] = field(default_factory=list)
    upto: int = -1
    _seen: set = field(default_factory=set)

    def update(self, signals: Signals, before: int | None = None) -> list[Precursor]:
        """Judge the sampled steps not judged yet (those before ``before`` only, when given: a step
        whose optimizer step has not run yet is judged on a later call); the new warnings."""
        new: list[Precursor] = []
        for step in signals.steps:
            if step <= self.upto or (before is not None and step >= before):
                continue
            history = History(signals, step)
            for rule in RULES.values():
                for w in rule.check(history, self.cfg):
                    key = (w.code, w.module)
                    if key not in self._seen:
                        self._seen.add(key)
                        new.append(w)
            self.upto = step
        self.found.extend(new)
        return new
