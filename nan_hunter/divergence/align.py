"""Which entry of one trace is which entry of the other.

Module level: an entry is a module call, and its key (module, call_index, input_index, step,
phase) names the same call in every run of the same model and inputs; entries are paired by key.
A call only one side has (a compiled region hides its children; a newer library adds a module)
is left unmatched and does not shift the rest.

Op level: entries are grouped by the call that ran them (the same key), groups are paired by
key, and inside a pair of groups the two op sequences are aligned on (op name, shape) by
``difflib.SequenceMatcher`` (a longest-common-subsequence style alignment, junk heuristics off).
A fused op on one side, or a new decomposition in a newer torch (``rms_norm`` → ``pow``, ``mean``,
``add``, ``rsqrt``, ``mul``), leaves those ops unmatched while the ops around them still pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from difflib import SequenceMatcher

from ..trace.format import Entry

Pair = tuple[int, int]  # (index in A, index in B)


def align_modules(a: Sequence[Entry], b: Sequence[Entry]) -> list[Pair]:
    """Pairs of A's and B's entries with the same key, in A's order."""
    where = {e.key: e.index for e in b}
    return [(e.index, where[e.key]) for e in a if e.key in where]


def _groups(entries: Sequence[Entry]) -> dict[tuple, list[Entry]]:
    out: dict[tuple, list[Entry]] = {}
    for e in entries:
        out.setdefault(e.key, []).append(e)
    return out


def align_ops(a: Sequence[Entry], b: Sequence[Entry]) -> list[Pair]:
    """Pairs of A's and B's op entries (module docstring), in A's order."""
    ga, gb = _groups(a), _groups(b)
    pairs: list[Pair] = []
    for key, ea in ga.items():
        eb = gb.get(key)
        if not eb:
            continue
        sa = [(e.op, e.shape) for e in ea]
        sb = [(e.op, e.shape) for e in eb]
        m = SequenceMatcher(None, sa, sb, autojunk=False)
        for blk in m.get_matching_blocks():
            pairs += [(ea[blk.a + k].index, eb[blk.b + k].index) for k in range(blk.size)]
    pairs.sort()
    return pairs


def align(level: str, a: Sequence[Entry], b: Sequence[Entry]) -> list[Pair]:
    return align_ops(a, b) if level == "ops" else align_modules(a, b)
