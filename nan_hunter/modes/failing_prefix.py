"""The shortest failing prefix of a sequence: for ``--generate`` (how many decode steps a prompt
needs before it fails) and bisect over inputs (how many inputs before one fails)."""

from __future__ import annotations

from collections.abc import Callable


def shortest_failing_prefix(length: int, fails: Callable[[int], bool]) -> int | None:
    """The smallest ``L`` in ``1..length`` with ``fails(L)``, or None if ``fails(length)`` is false.

    For bisecting inputs: ``fails(L)`` runs the first ``L`` inputs and says whether any of them
    fails; it is assumed monotone (if a prefix fails, every longer one does). Evaluates the full
    length first, then bisects: at most ``1 + ceil(log2 length)`` calls, never the same length
    twice, and none when ``length == 0``.
    """
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if length == 0 or not fails(length):
        return None
    lo, hi = 1, length  # the answer is in [lo, hi]; hi is known to fail
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
