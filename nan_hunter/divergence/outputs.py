"""Whether two runs' final outputs differ: ``outputs_verdict`` → ``OutputsVerdict``.

The outputs of a root call are, at level ops, the entries marked ``output`` (the ops that made
the root call's floating outputs); at level modules, the root module's entries (``module ""``).
A trace that marks no output at level ops (written before the mark existed) is read as "the
last entry of each root call", with a note. Per root call (input, step) the paired output
entries are compared: ``bitwise`` when every pair has the same hash and dtype, ``within_tolerance``
when every pair agrees by the rule, else ``differ`` (an output entry with no counterpart
differs). The verdict over every root call is the worst, with the largest ``rel_err``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: worst last
EQUAL = ("bitwise", "within_tolerance", "differ")


@dataclass(frozen=True)
class OutputsVerdict:
    """``outputs`` of ``nanhunter.diff/v1``: ``equal`` one of ``EQUAL``; ``rel_err`` the largest
    over the output entries (inf where the non-finite classes differ; None when nothing was
    paired); ``tolerance`` the one they were judged by (the loosest where several)."""

    equal: str
    rel_err: float | None
    tolerance: float | None
    calls: int  # root calls (input, step) compared
    unpaired: int = 0  # root calls whose output entries have no counterpart on the other side

    def to_dict(self) -> dict[str, Any]:
        err = self.rel_err
        return {
            "equal": self.equal,
            "rel_err": err if err is None or math.isfinite(err) else None,
            "tolerance": self.tolerance,
            "calls": self.calls,
            "unpaired": self.unpaired,
        }


def output_groups(entries: Sequence[Any], level: str, marked: bool) -> dict[tuple[int, int], list[int]]:
    """(input_index, step) → the indices of the entries that are that root call's outputs."""
    groups: dict[tuple[int, int], list[int]] = {}
    if marked:
        for e in entries:
            if getattr(e, "output", False):
                groups.setdefault((e.input_index, e.step), []).append(e.index)
    elif level == "modules":
        for e in entries:
            if e.module == "":
                groups.setdefault((e.input_index, e.step), []).append(e.index)
    else:
        for e in entries:
            groups[(e.input_index, e.step)] = [e.index]  # the last one stays
    return groups


def outputs_verdict(
    a: Sequence[Any], b: Sequence[Any], level: str, pairs: Sequence[tuple[int, int]], verdicts: dict[int, Any]
) -> tuple[OutputsVerdict | None, str | None]:
    """The outputs' verdict and a note (or None), from paired entries and their verdicts (by A's
    index: ``rel_err``, ``tolerance``, ``agrees``)."""
    marked = (
        level == "ops"
        and any(getattr(e, "output", False) for e in a)
        and any(getattr(e, "output", False) for e in b)
    )
    note = None
    if level == "ops" and not marked:
        note = (
            "the traces do not mark the outputs (written before nanhunter 1.4, or one side only): the last "
            "entry of each root call is taken as its output"
        )
    ga, gb = output_groups(a, level, marked), output_groups(b, level, marked)
    if not ga and not gb:
        return None, "no entry holds the model's outputs: whether the runs' outputs differ is not known"
    b_of = dict(pairs)
    worst, errs, tols, unpaired = 0, [], [], 0
    for key in sorted(set(ga) | set(gb)):
        ia, ib = ga.get(key, []), gb.get(key, [])
        paired = [i for i in ia if i in b_of]
        if not ia or not ib or len(paired) != len(ia) or sorted(b_of[i] for i in paired) != sorted(ib):
            worst = len(EQUAL) - 1  # an output with no counterpart: they differ
            unpaired += 1
            continue
        for i in paired:
            v = verdicts[i]
            same = v.a.stats.hash is not None and v.a.stats.hash == v.b.stats.hash and v.a.dtype == v.b.dtype
            level_ = 0 if same else 1 if v.agrees else 2
            worst = max(worst, level_)
            errs.append(0.0 if same else v.rel_err)
            tols.append(v.tolerance)
    return OutputsVerdict(
        EQUAL[worst],
        max(errs) if errs else None,
        max(tols) if tols else None,
        len(set(ga) | set(gb)),
        unpaired,
    ), note
