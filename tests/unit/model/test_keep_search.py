"""model.keep_search: the one keep-set search, shared by ``bisect`` (through ``bisection.search``)
and ``scan``'s keep-in-higher-precision fix. The search's own properties are tested in
tests/unit/bisection/test_search.py; here, that both names are the same search."""

from __future__ import annotations

from nan_hunter.bisection import search as via_bisect
from nan_hunter.model import keep_search


def test_bisect_and_scan_share_one_search():
    assert via_bisect.minimal_keep_set is keep_search.minimal_keep_set
    assert via_bisect.PrecisionSearch is keep_search.PrecisionSearch


def test_and_interaction_found_whole():
    """Two modules both needed (down_proj AND the final norm in the quick start): both kept."""
    need = {"c", "f"}
    res = keep_search.minimal_keep_set(list("abcdefg"), lambda k: need <= k, hint="c")
    assert res.solvable and set(res.keep) == need and res.runs <= res.bound
