"""The producer rule, a pure function of recorded calls and their stats rows.

Producer rule (docs/contract.md): walking module calls in completion order (innermost first), the
first call whose output is non-finite while its inputs and its own parameters are finite is
the producer. A call whose output is non-finite because its *input* already was is not: the
value came from an op in the enclosing call's own forward (a residual add written in the
block), so blame passes to the innermost enclosing call; at the root it was the data.

Phases (``capture.records``): steps are searched in order, and within a step forward, then
backward, then the optimizer. Backward reads the same rule in autograd's order: the first
gradient that went non-finite (by event) while the gradients reaching that module were finite
names the module; when they were not, the enclosing module's own backward code made them (blame
walks up); at the root, the gradient arrived non-finite from the loss (role "input"). The
optimizer: the first parameter, in ``param_groups`` order, non-finite after the step while it
and its gradient were finite before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..capture.records import PHASES, Call
from ..dtypes import HEADROOM_DTYPES
from ..kernels.stats import TensorStats
from ..report import FirstNonfinite, ModuleRow

Rows = Sequence[TensorStats]


@dataclass
class Finding:
    call: Call
    role: str  # producer | weights | input
    kind: str
    tensor: str | None
    received_by: Call | None = None  # for role "input": first module that received the bad data


def _bad(rows: Rows, refs: list[tuple[str, int]]) -> tuple[str, TensorStats] | None:
    """First non-finite tensor among refs, preferring NaN/+inf over −inf-only."""
    hits = [(label, rows[r]) for label, r in refs if not rows[r].finite]
    if not hits:
        return None
    strong = [h for h in hits if h[1].nan or h[1].posinf]
    return (strong or hits)[0]


def _kind_of(st: TensorStats) -> str:
    return st.kind or "nan"


def first_finding(all_calls: Sequence[Call], rows: Rows, input_index: int | None = None) -> Finding | None:
    """The first non-finite value by (step, phase, completion order), with its role (docstring above)."""
    chosen = [c for c in all_calls if input_index is None or c.input_index == input_index]
    steps = sorted({c.input_index for c in chosen})
    for step in steps:
        for phase in PHASES:
            calls = [c for c in chosen if c.input_index == step and c.phase == phase]
            if not calls:
                continue
            if phase == "forward":
                f = _forward_finding(calls, rows)
            elif phase == "backward":
                f = _backward_finding(calls, rows)
            else:
                f = _optimizer_finding(calls, rows)
            if f is not None:
                return f
    return None


def _backward_finding(calls: list[Call], rows: Rows) -> Finding | None:
    by_start = {c.start: c for c in calls}
    firsts = []
    for c in calls:
        bad = [o for (_, r), o in zip(c.outputs, c.order) if not rows[r].finite]
        if bad:
            firsts.append((min(bad), c.depth, c.start, c))
    for _, _, _, c in sorted(firsts, key=lambda x: (x[0], -x[1], x[2])):
        out_bad = _bad(rows, c.outputs)
        assert out_bad is not None  # c is in firsts: one of its outputs is non-finite
        if _bad(rows, c.inputs) is None:
            return Finding(c, "producer", _kind_of(out_bad[1]), out_bad[0])
        cur = c
        while cur.parent is not None and cur.parent in by_start:
            parent = by_start[cur.parent]
            if _bad(rows, parent.inputs) is None:
                return Finding(parent, "producer", _kind_of(out_bad[1]), None)
            cur = parent
        st = _bad(rows, cur.inputs)
        return Finding(cur, "input", _kind_of(st[1]) if st else "nan", st[0] if st else None, cur)
    return None


def _optimizer_finding(calls: list[Call], rows: Rows) -> Finding | None:
    for c in sorted(calls, key=lambda c: c.seq):
        out_bad = _bad(rows, c.outputs)
        if out_bad is not None and _bad(rows, c.inputs) is None:
            return Finding(c, "producer", _kind_of(out_bad[1]), c.param)
    return None


def _forward_finding(all_calls: list[Call], rows: Rows) -> Finding | None:
    calls = [c for c in all_calls if c.seq >= 0]
    by_start = {c.start: c for c in all_calls}
    for c in sorted(calls, key=lambda c: (c.input_index, c.seq)):
        out_bad = _bad(rows, c.outputs)
        if out_bad is None:
            continue
        in_bad = _bad(rows, c.inputs)
        if in_bad is None:
            p_bad = _bad(rows, c.params)
            if p_bad is not None:
                return Finding(c, "weights", _kind_of(p_bad[1]), p_bad[0])
            return Finding(c, "producer", _kind_of(out_bad[1]), out_bad[0])
        # The input was already bad: walk up to the call whose own forward made it.
        cur = c
        while cur.parent is not None:
            parent = by_start[cur.parent]
            if _bad(rows, parent.inputs) is None:
                p_bad = _bad(rows, parent.params)
                role = "weights" if p_bad is not None else "producer"
                return Finding(parent, role, _kind_of(out_bad[1]), p_bad[0] if p_bad else None)
            cur = parent
        # The root's input itself: bad data. Blame the first module that received it.
        recv = next(
            (
                x
                for x in sorted(all_calls, key=lambda x: x.start)
                if x.input_index == cur.input_index and x.parent is not None and _bad(rows, x.inputs)
            ),
            cur,
        )
        st = _bad(rows, cur.inputs)
        return Finding(recv, "input", _kind_of(st[1]) if st else "nan", st[0] if st else None, recv)
    # Non-finite data that no module turned into a bad output.
    for c in sorted(calls, key=lambda c: c.start):
        if c.parent is None:
            st = _bad(rows, c.inputs)
            if st is not None and (st[1].nan or st[1].posinf):
                recv = next(
                    (
                        x
                        for x in sorted(all_calls, key=lambda x: x.start)
                        if x.input_index == c.input_index and x.parent is not None and _bad(rows, x.inputs)
                    ),
                    c,
                )
                return Finding(recv, "input", _kind_of(st[1]), st[0], recv)
    return None


def failed_inputs(calls: Sequence[Call], rows: Rows) -> list[int]:
    """Steps (inputs of the data set) in which any phase's output went non-finite, or whose data held NaN/+inf."""
    bad: set[int] = set()
    for c in calls:
        if c.seq >= 0 and _bad(rows, c.outputs) is not None:
            bad.add(c.input_index)
        elif c.parent is None and (st := _bad(rows, c.inputs)) is not None and (st[1].nan or st[1].posinf):
            bad.add(c.input_index)
    return sorted(bad)


def mask_notes(calls: Sequence[Call], rows: Rows) -> list[str]:
    """−inf-only inputs that were absorbed (no module output went non-finite from them)."""
    seen: set[str] = set()
    notes = []
    for c in calls:
        if c.phase != "forward":
            continue
        st = _bad(rows, c.inputs)
        if st is None or st[1].nan or st[1].posinf:
            continue
        if _bad(rows, c.outputs) is None and c.module not in seen:
            seen.add(c.module)
            notes.append(
                f"mask: {st[1].neginf} −inf values in {c.module or '<root>'} input {st[0]} were "
                f"absorbed (softmax/where/masked_fill) — an attention mask, not a fault"
            )
    return notes


def call_table(calls: Sequence[Call], rows: Rows) -> list[ModuleRow]:
    """Per module call in completion order: name, type, call index, output absmax and counts."""
    out: list[ModuleRow] = []
    rank = {p: i for i, p in enumerate(PHASES)}
    for c in sorted((c for c in calls if c.seq >= 0), key=lambda c: (c.input_index, rank[c.phase], c.seq)):
        absmax = absmin = None
        nan = pos = neg = numel = 0
        subnormal: int | None = 0
        flushed: dict[str, int | None] = dict.fromkeys(HEADROOM_DTYPES, 0)
        for _, r in c.outputs:
            st = rows[r]
            nan, pos, neg = nan + st.nan, pos + st.posinf, neg + st.neginf
            if st.absmax is not None:
                absmax = st.absmax if absmax is None else max(absmax, st.absmax)
            if st.min_nonzero is not None and math.isfinite(st.min_nonzero):  # inf: no non-zero value
                absmin = st.min_nonzero if absmin is None else min(absmin, st.min_nonzero)
            numel += st.numel
            subnormal = None if subnormal is None or st.subnormal is None else subnormal + st.subnormal
            for d, k in flushed.items():
                n = st.flushed(d)
                flushed[d] = None if k is None or n is None else k + n
        in_absmax = max((rows[r].absmax or 0.0 for _, r in c.inputs), default=None)
        out.append(
            ModuleRow(
                c.module,
                c.module_type,
                c.call_index,
                c.input_index,
                c.depth,
                absmax,
                in_absmax,
                nan,
                pos,
                neg,
                # abs-min beside abs-max; the share of outputs that are subnormal in their own dtype
                # (flushed to zero where denormals are flushed, e.g. FTZ/DAZ kernels)
                min_nonzero=absmin,
                subnormal_frac=subnormal / numel if subnormal is not None and numel else None,
                # per target dtype, the share of outputs a cast to it rounds to zero (non-zero before)
                flush_frac={d: k / numel if k is not None and numel else None for d, k in flushed.items()},
                phase=c.phase,
                param=c.param if c.phase != "forward" else None,
            )
        )
    return out


def to_first_nonfinite(f: Finding, ev: Any = None, step: int | None = None) -> FirstNonfinite:
    """The report's ``first_nonfinite`` from a finding and its op event (``ops.OpEvent`` or None).
    For a producer the kind is the op's (an inf often comes one op before the NaN that reaches
    the module output); values that came in non-finite keep the kind seen at the module.
    ``step`` defaults to the root-call index (the meaning under ``watch()``)."""
    c = f.call
    op = ev.op if ev is not None else None
    source = ev.source if ev is not None else None
    kind = ev.kind if ev is not None and f.role == "producer" else None
    return FirstNonfinite(
        input_index=c.input_index,
        module=c.module,
        module_type=c.module_type,
        op=op,
        kind=kind or f.kind,
        role=f.role,
        call_index=c.call_index,
        source=source,
        tensor=f.tensor,
        step=c.input_index if step is None else step,
        phase=c.phase,
        grad_fn=getattr(ev, "grad_fn", None),
        param=c.param,
    )
