"""Diff results for the diff views' tests: two hand-made traces (tests/unit/divergence/synthetic.py)
compared by the real ``compare_traces``."""

from __future__ import annotations

from pathlib import Path

from nan_hunter.divergence.compare import DiffResult, compare_traces
from nan_hunter.trace.reader import read_trace

from ..divergence.synthetic import ENV, entry, write


def diverging(tmp: Path, module: str = "mid", env_b: dict | None = None) -> DiffResult:
    """A and B agree on ``pre``'s mm, then part at ``module``'s exp (2.0 against 2.5)."""
    a = [
        entry("pre", "aten.mm.default", producers=[None]),
        entry(module, "aten.exp.default", absmax=2.0, producers=[0], output=True),
    ]
    b = [
        entry("pre", "aten.mm.default", producers=[None]),
        entry(module, "aten.exp.default", absmax=2.5, producers=[0], output=True),
    ]
    return compare_traces(
        read_trace(write(tmp / "a.jsonl", a)), read_trace(write(tmp / "b.jsonl", b, env=env_b))
    )


def agreeing(tmp: Path) -> DiffResult:
    e = [
        entry("m", "aten.mm.default", producers=[None]),
        entry("m", "aten.relu.default", producers=[0], output=True),
    ]
    return compare_traces(read_trace(write(tmp / "a.jsonl", e)), read_trace(write(tmp / "b.jsonl", e)))


def one_side_nonfinite(tmp: Path) -> DiffResult:
    """B has one more op than A, after the last one they share, and it is +inf: nothing paired
    parts, but only B is non-finite."""
    a = [entry("m", "aten.mm.default", producers=[None], output=True)]
    b = [
        entry("m", "aten.mm.default", producers=[None], output=True),
        entry("m", "aten.exp.default", absmax=0.0, posinf=2, producers=[0]),
    ]
    return compare_traces(read_trace(write(tmp / "a.jsonl", a)), read_trace(write(tmp / "b.jsonl", b)))


__all__ = ["ENV", "agreeing", "diverging", "one_side_nonfinite"]
