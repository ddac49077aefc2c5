"""A straight line through a signal's level in dB over steps, and how far to trust it.

Levels are ``20·log10(value)`` (a signal that doubles rises 6.02 dB), so steady exponential growth
— what a divergence at a high learning rate looks like — is a line, and the headroom to a dtype's
largest finite value is the distance from that line to ``20·log10(max)``. The fit is ordinary
least squares on the latest points; the slope's standard error says whether the level moves at all
(``shrinking``: it rises by more than ``T_MIN`` standard errors), and R² with the number of points
says how far a projection may be trusted (``confidence``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

T_MIN = 2.0  # a slope counts as real when it is at least this many standard errors from zero
HIGH = (6, 0.8)  # (points, R²) for confidence "high"
MEDIUM = (4, 0.5)  # (points, R²) for confidence "medium"; below: "low" (no projection)
#: a projection further ahead than this many times the fitted span of steps is at most "medium",
#: and past ``FAR_SPANS`` "low" (not projected): a line through 80 steps says little about step 1,000
NEAR_SPANS = 1.0
FAR_SPANS = 3.0


def level_db(value: float) -> float:
    """A magnitude in dB (20·log10); -inf for 0."""
    return 20.0 * math.log10(value) if value > 0 else -math.inf


@dataclass(frozen=True)
class Trend:
    """The least-squares line ``level = intercept + slope·step`` through ``n`` points."""

    n: int
    slope: float  # dB per step (positive: the level rises, the headroom shrinks)
    intercept: float
    r2: float  # 1 for a perfect line; 0 when the line explains nothing
    t: float  # slope / its standard error (inf for a perfect, non-flat line)
    last_step: int
    last_level: float  # the latest observed level
    first_step: int | None = None  # the earliest fitted point's step (the span the line was fitted over)

    @property
    def rising(self) -> bool:
        """The level rises by more than noise: the slope is ``T_MIN`` standard errors above zero."""
        return self.slope > 0 and self.t >= T_MIN

    @property
    def confidence(self) -> str:
        """ "high", "medium" or "low" from the number of points and R² (``HIGH``, ``MEDIUM``)."""
        for name, (n, r2) in (("high", HIGH), ("medium", MEDIUM)):
            if self.n >= n and self.r2 >= r2 and self.rising:
                return name
        return "low"

    def crossing(self, level: float) -> int | None:
        """The step at which the line reaches ``level`` (no earlier than the latest point); None when
        it does not rise, the confidence is low, or the step lies further ahead than ``FAR_SPANS``
        times the fitted span."""
        step = self.projection(level)
        if step is None or self.confidence_at(step) == "low":
            return None
        return step

    def projection(self, level: float) -> int | None:
        """Where the line reaches ``level`` (the latest step when it is there already), however far
        ahead; None when it does not rise."""
        if not self.rising:
            return None
        if self.last_level >= level:
            return self.last_step  # crossed already
        return max(self.last_step, math.ceil((level - self.intercept) / self.slope))

    def confidence_at(self, step: int | None) -> str:
        """The confidence of a projection to ``step``: the line's own (``confidence``), lowered
        when ``step`` lies far beyond the steps it was fitted over (``NEAR_SPANS``, ``FAR_SPANS``)."""
        base = self.confidence
        if step is None or self.first_step is None or base == "low":
            return base
        span = max(1, self.last_step - self.first_step)
        ahead = step - self.last_step
        if ahead > FAR_SPANS * span:
            return "low"
        if ahead > NEAR_SPANS * span and base == "high":
            return "medium"
        return base


def fit(points: list[tuple[int, float]]) -> Trend | None:
    """The line through ``(step, level_db)`` points (non-finite levels left out); None with fewer
    than three points or a single step."""
    pts = [(s, y) for s, y in points if math.isfinite(y)]
    n = len(pts)
    if n < 3:
        return None
    mx = sum(s for s, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((s - mx) ** 2 for s, _ in pts)
    if sxx == 0:
        return None
    sxy = sum((s - mx) * (y - my) for s, y in pts)
    slope = sxy / sxx
    intercept = my - slope * mx
    sse = sum((y - intercept - slope * s) ** 2 for s, y in pts)
    syy = sum((y - my) ** 2 for _, y in pts)
    r2 = 1.0 - sse / syy if syy > 0 else 0.0
    se = math.sqrt(sse / (n - 2) / sxx)
    t = slope / se if se > 0 else (math.inf if slope > 0 else -math.inf if slope < 0 else 0.0)
    return Trend(n, slope, intercept, r2, t, pts[-1][0], pts[-1][1], pts[0][0])
