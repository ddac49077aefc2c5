"""Where two traces part: ``compare_traces(a, b)`` → ``DiffResult`` (``nanhunter diff``).

1. Comparable? The same trace level, module names, parameter shapes and input hashes, and the
   same output shape at every paired module call; else ``NotComparable`` saying which.
2. Align (``align``): pairs of entries, the rest unmatched.
3. Judge every pair by the one rule (``trace.rule``): it agrees when ``rel_err`` ≤ tolerance.
4. The first divergence is the first pair, in A's execution order, that does not agree while
   its inputs do — the entry that made the difference, not one that passed it on. Inputs agree:
   op level, when every entry that produced an operand agrees (an unmatched producer, fused or
   extra on one side, stands for its own producers); module level, when the call's recorded
   input statistics agree by the same rule (entries without them: when the preceding paired
   entry agrees). When every disagreeing pair has disagreeing inputs (a producer never
   compared), the first of them is reported with ``inputs_agree`` false.
5. The first non-finite entry of each side: the first holding a NaN or +inf, else the first
   holding −inf (how attention masks are written).

Exit code (``DiffResult.exit_code``): 0 no divergence; 1 a divergence, or one side non-finite
where the other is not; 2 (``NotComparable``, raised) the traces cannot be compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadInput
from ..kernels.compare import compare as one_comparison
from ..trace.format import Entry
from ..trace.reader import Trace
from ..trace.rule import rel_err, tolerance
from .align import Pair, align
from .env_diff import env_diff

SCHEMA = "nanhunter.diff/v1"


class NotComparable(BadInput):
    """Two traces of different models or inputs (exit 2, one line saying which)."""


@dataclass(frozen=True)
class PairVerdict:
    a: Any  # an Entry, or a recordings.Recorded
    b: Any
    rel_err: float
    tolerance: float
    comparison: Any = None  # compare.Comparison, when both sides kept their tensors

    @property
    def agrees(self) -> bool:
        return self.rel_err <= self.tolerance


@dataclass(frozen=True)
class Divergence:
    """The first divergence (contract fields, plus where it sits in each file)."""

    verdict: PairVerdict
    inputs_agree: bool

    def to_dict(self) -> dict[str, Any]:
        a, b = self.verdict.a, self.verdict.b

        def side(e: Entry) -> dict[str, Any]:
            return {**e.stats.to_dict(), "spread": e.spread, "dtype": e.dtype, "shape": list(e.shape),
                    "index": e.index}
        err = self.verdict.rel_err
        return {"module": a.module, "module_type": a.module_type, "op": a.op, "call_index": a.call_index,
                "input_index": a.input_index, "step": a.step, "phase": a.phase, "source_file": a.source_file,
                "source_line": a.source_line, "a": side(a), "b": side(b),
                "rel_err": err if math.isfinite(err) else None, "classes_differ": math.isinf(err),
                "tolerance": self.verdict.tolerance, "inputs_agree": self.inputs_agree}


@dataclass
class DiffResult:
    """``nanhunter diff``'s answer (JSON: ``to_dict``, schema ``nanhunter.diff/v1``)."""

    a: Trace
    b: Trace
    level: str
    rtol: float | None
    env_diff: list[dict[str, Any]]
    pairs: list[Pair]
    first_divergence: Divergence | None
    first_nonfinite_a: Entry | None
    first_nonfinite_b: Entry | None
    max_rel_err: float | None  # over the finite pairs (those whose classes agree)
    notes: list[str] = field(default_factory=list)

    @property
    def compared(self) -> int:
        return len(self.pairs)

    @property
    def unmatched(self) -> tuple[int, int]:
        return len(self.a.entries) - len(self.pairs), len(self.b.entries) - len(self.pairs)

    @property
    def one_side_nonfinite(self) -> bool:
        return (self.first_nonfinite_a is None) != (self.first_nonfinite_b is None)

    @property
    def exit_code(self) -> int:
        return 1 if self.first_divergence is not None or self.one_side_nonfinite else 0

    def to_dict(self) -> dict[str, Any]:
        def fnf(e: Entry | None) -> dict[str, Any] | None:
            return None if e is None else {"module": e.module, "op": e.op, "index": e.index, "kind": e.stats.kind}
        ua, ub = self.unmatched
        return {"schema": SCHEMA,
                "a": {"path": self.a.path, "env": self.a.header.env},
                "b": {"path": self.b.path, "env": self.b.header.env},
                "env_diff": self.env_diff, "compared": self.compared, "unmatched": {"a": ua, "b": ub},
                "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
                "first_nonfinite": {"a": fnf(self.first_nonfinite_a), "b": fnf(self.first_nonfinite_b)},
                "level": self.level, "rtol": self.rtol,
                "max_rel_err": self.max_rel_err if self.max_rel_err is None or math.isfinite(self.max_rel_err)
                else None,
                "exit_code": self.exit_code, "notes": self.notes}


# -- 1. comparable? ---------------------------------------------------------------------------
def _names(t: Trace) -> list[str]:
    return list(t.header.model.get("modules") or [])


def _few(names: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def check_comparable(a: Trace, b: Trace) -> None:
    """``NotComparable`` (exit 2) naming what differs, when the two traces are not of the same
    model and inputs."""
    if a.header.level != b.header.level:
        raise NotComparable(f"A is a trace at level {a.header.level} and B one at level {b.header.level}: record "
                            "both with the same --trace-level")
    na, nb = _names(a), _names(b)
    if na != nb:
        only_a = [n for n in na if n not in set(nb)]
        only_b = [n for n in nb if n not in set(na)]
        what = "; ".join(x for x in ((f"only in A: {_few(only_a)}" if only_a else ""),
                                     (f"only in B: {_few(only_b)}" if only_b else "")) if x) or "in another order"
        raise NotComparable(f"different models: module names differ ({what})")
    sa, sb = a.header.model.get("param_shapes_hash"), b.header.model.get("param_shapes_hash")
    if sa != sb:
        raise NotComparable(f"different models: the same module names but other parameter shapes "
                            f"({a.header.model.get('parameters')} vs {b.header.model.get('parameters')} parameters)")
    ia, ib = a.header.inputs, b.header.inputs
    if len(ia) != len(ib):
        raise NotComparable(f"different inputs: A ran {len(ia)} input(s), B {len(ib)}")
    for x, y in zip(ia, ib):
        if x.get("hash") != y.get("hash"):
            label = x.get("label") or y.get("label")
            raise NotComparable(f"different inputs: input #{x.get('index', '?')}"
                                + (f" ({label})" if label else "")
                                + f" has hash {x.get('hash')} in A and {y.get('hash')} in B")


# -- 3.-5. judging --------------------------------------------------------------------------------
def judge(a: Any, b: Any, rtol: float | None) -> PairVerdict:
    """One pair by the one rule (``trace.rule``). Entries of in-memory recordings that kept their
    tensors (``recordings.Recorded.values``: ``scan --compile``) are compared element by element
    instead (``kernels.compare``: ``error`` is inf where the non-finite classes differ)."""
    tol = tolerance(rtol, (a.dtype, b.dtype), (a.spread, b.spread))
    va, vb = getattr(a, "values", None), getattr(b, "values", None)
    if va is not None and vb is not None:

        c = one_comparison(list(va), list(vb))
        return PairVerdict(a, b, c.error, tol, c)
    return PairVerdict(a, b, rel_err(a.stats, b.stats, a.dtype), tol)


def _inputs_agree_ops(e: Any, verdicts: dict[int, PairVerdict], a_entries: list[Any],
                      memo: dict[int, bool]) -> bool:
    """Every producer of ``e``'s operands agrees (an unmatched producer: its own producers)."""
    for p in e.producers or ():
        if p is None:
            continue
        if p in verdicts:
            if not verdicts[p].agrees:
                return False
            continue
        if p not in memo:
            memo[p] = True  # a cycle cannot happen (producers are earlier), but stay safe
            memo[p] = _inputs_agree_ops(a_entries[p], verdicts, a_entries, memo)
        if not memo[p]:
            return False
    return True


def first_nonfinite(entries: list[Any]) -> Any:
    first_neg = None
    for e in entries:
        if e.stats.nan or e.stats.posinf:
            return e
        if e.stats.neginf and first_neg is None:
            first_neg = e
    return first_neg


@dataclass
class RecordingsComparison:
    """Two recordings judged pair by pair (steps 2-5 of the module docstring)."""

    pairs: list[Pair]
    verdicts: dict[int, PairVerdict]  # by A's index
    first_divergence: Divergence | None
    first_nonfinite_a: Any
    first_nonfinite_b: Any
    max_rel_err: float | None
    notes: list[str] = field(default_factory=list)

    def verdict_for(self, key: tuple) -> PairVerdict | None:
        return next((v for v in self.verdicts.values() if v.a.key == key), None)

    @property
    def same_first_fault(self) -> bool | None:
        """Whether A holds B's first non-finite value again: the entry paired with B's first
        non-finite entry has the same non-finite classes (None: B has none, or it is unpaired)."""
        fb = self.first_nonfinite_b
        if fb is None:
            return None
        v = next((v for v in self.verdicts.values() if v.b.index == fb.index), None)
        if v is None:
            return None
        return bool(v.a.stats.kind) and (v.a.stats.nan > 0, v.a.stats.posinf > 0, v.a.stats.neginf > 0) == \
            (fb.stats.nan > 0, fb.stats.posinf > 0, fb.stats.neginf > 0)


def compare_recordings(a: list[Any], b: list[Any], level: str = "modules",
                       rtol: float | None = None) -> RecordingsComparison:
    """Align two recordings (trace entries or ``recordings.Recorded``; B is the reference), judge
    every pair and find the first divergence and each side's first non-finite entry."""
    pairs = align(level, a, b)
    verdicts: dict[int, PairVerdict] = {ia: judge(a[ia], b[ib], rtol) for ia, ib in pairs}
    first: Divergence | None = None
    fallback: Divergence | None = None
    memo: dict[int, bool] = {}
    prev_agrees = True
    notes: list[str] = []
    for ia, _ in pairs:
        v = verdicts[ia]
        e = v.a
        if level == "ops":
            inputs_ok = _inputs_agree_ops(e, verdicts, a, memo)
        elif e.input is not None and v.b.input is not None:
            inputs_ok = rel_err(e.input, v.b.input, e.dtype) <= v.tolerance
        else:
            inputs_ok = prev_agrees
        if not v.agrees:
            if inputs_ok:
                first = Divergence(v, True)
                break
            if fallback is None:
                fallback = Divergence(v, False)
        prev_agrees = v.agrees
    if first is None and fallback is not None:
        first = fallback
        notes.append("every entry that differs has inputs that differ or were never compared (fused or extra on "
                     "one side): the first of them is shown, with inputs_agree false")
    finite_errs = [v.rel_err for v in verdicts.values() if math.isfinite(v.rel_err)]
    return RecordingsComparison(pairs, verdicts, first, first_nonfinite(a), first_nonfinite(b),
                                max(finite_errs) if finite_errs else None, notes)


def compare_traces(a: Trace, b: Trace, rtol: float | None = None) -> DiffResult:
    """A against B (B is the reference of ``rel_err``): see the module docstring."""
    if rtol is not None and not (isinstance(rtol, (int, float)) and math.isfinite(rtol) and rtol > 0):
        raise BadInput(f"--rtol {rtol!r}: give a positive number such as 1e-3")
    check_comparable(a, b)
    level = a.header.level
    if level == "modules":
        for ia, ib in align(level, a.entries, b.entries):
            ea, eb = a.entries[ia], b.entries[ib]
            if ea.shape != eb.shape:
                raise NotComparable(f"different inputs or models: {ea.module or '<root>'} (call {ea.call_index}, "
                                    f"input {ea.input_index}, step {ea.step}) returns shape {list(ea.shape)} in A and "
                                    f"{list(eb.shape)} in B")
    cmp = compare_recordings(a.entries, b.entries, level, rtol)
    notes = list(cmp.notes)
    ua, ub = len(a.entries) - len(cmp.pairs), len(b.entries) - len(cmp.pairs)
    if ua or ub:
        notes.append(f"{ua} entr{'y' if ua == 1 else 'ies'} of A and {ub} of B have no counterpart (fused, hidden "
                     "in a compiled region, or present in one version only) and were not compared")
    ca, cb = a.header.env.get("compile"), b.header.env.get("compile")
    if ca != cb:
        which = " and ".join(f"{s} ran under torch.compile ({c})" for s, c in (("A", ca), ("B", cb)) if c)
        notes.append(f"{which}: module calls inside a compiled region are not seen, so the divergence is named at "
                     "the nearest call outside it; `nanhunter scan --compile` searches the module where compiled and "
                     "eager part (compile.first_divergent_module)")
    return DiffResult(a, b, level, rtol, env_diff(a.header.env, b.header.env), cmp.pairs, cmp.first_divergence,
                      cmp.first_nonfinite_a, cmp.first_nonfinite_b, cmp.max_rel_err, notes)


def plot_series(res: DiffResult) -> dict[str, Any]:
    """What the HTML plot draws: A's absmax per entry, B's at the entries paired with them, the
    A positions of non-finite entries on each side, and the divergence's A index."""
    b_of = dict(res.pairs)
    a_vals = [e.stats.absmax for e in res.a.entries]
    b_vals = [res.b.entries[b_of[i]].stats.absmax if i in b_of else None for i in range(len(res.a.entries))]
    bad_a = [e.index for e in res.a.entries if e.stats.kind is not None]
    bad_b = [i for i in range(len(res.a.entries)) if i in b_of and res.b.entries[b_of[i]].stats.kind is not None]
    mark = res.first_divergence.verdict.a.index if res.first_divergence else None
    return {"a": a_vals, "b": b_vals, "bad_a": bad_a, "bad_b": bad_b, "mark": mark}
