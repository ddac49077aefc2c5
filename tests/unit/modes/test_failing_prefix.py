"""``modes.failing_prefix``: the fewest calls, never the same length twice, the edges."""

from __future__ import annotations

import math

import pytest

from nan_hunter.modes.failing_prefix import shortest_failing_prefix


def test_shortest_failing_prefix_every_threshold():
    for length in range(1, 70):
        for t in range(1, length + 2):  # t == length + 1: nothing fails
            calls: list[int] = []

            def fails(m: int, t=t, calls=calls, length=length) -> bool:
                assert 1 <= m <= length
                calls.append(m)
                return m >= t

            got = shortest_failing_prefix(length, fails)
            assert got == (t if t <= length else None)
            assert calls[0] == length
            assert len(calls) == len(set(calls))
            assert len(calls) <= 1 + math.ceil(math.log2(length))


def test_shortest_failing_prefix_edges():
    assert shortest_failing_prefix(0, lambda m: pytest.fail("must not be called")) is None
    assert shortest_failing_prefix(1, lambda m: True) == 1
    assert shortest_failing_prefix(1, lambda m: False) is None
    assert shortest_failing_prefix(5, lambda m: True) == 1
    with pytest.raises(ValueError):
        shortest_failing_prefix(-1, lambda m: True)
