"""Where two traces part: ``compare_traces(a, b)`` → ``DiffResult`` (``nanhunter diff``).

1. Comparable? The same trace level, module names, parameter shapes and input hashes, and the
   same output shape at every paired module call; else ``NotComparable`` saying which.
2. Align (``align``): pairs of entries, the rest unmatched.
3. Judge every pair by the one rule (``trace.rule``: symmetric ``rel_err``, a difference below
   the dtype's smallest normal agrees), with the tolerance of the precision it was computed in:
   the loosest among the dtypes its output and inputs carry on both sides (``precision``).
4. The first divergence is the first pair, in A's execution order, that does not agree while
   its inputs do (by the same tolerance) — the entry that made the difference, not one that
   passed it on. An exact op (widening cast, copy, concatenation, indexing) is never it: it stands
   for its own producers. Inputs agree: op level, when every paired entry the operands come from
   agrees (through unpaired entries: fused or extra on one side); module level, when the call's
   recorded input statistics agree (entries without them: when the preceding paired entry
   agrees). Entries with no counterpart are judged at the first paired entry after them: when it
   differs while everything before agreed, the divergence is that region (``Region``: the ops of
   each side, and the innermost module holding them). When every pair that differs has inputs
   that differ, the first of them is reported with ``inputs_agree`` false: a module's outputs
   that differ beyond tolerance are never "no divergence".
5. The first non-finite entry of each side: the first holding a NaN or +inf, else the first
   holding −inf (how attention masks are written).
6. The outputs (``outputs``): the model's final outputs per input, ``bitwise`` equal,
   ``within_tolerance`` or ``differ``.

Exit code (``DiffResult.exit_code``, contract v1.4): 1 when the outputs differ beyond tolerance or
one side is non-finite where the other is not, else 0 — a divergence inside that did not reach
the outputs is reported with exit 0; ``fail_on="divergence"`` gives 1 for any divergence (v1.3).
2 (``NotComparable``, raised): the traces cannot be compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadInput
from ..kernels.compare import compare as one_comparison
from ..trace.format import Entry
from ..trace.reader import Trace
from ..trace.rule import rel_err, smallest_normal, tolerance
from .align import Pair, align
from .env_diff import env_diff
from .outputs import OutputsVerdict, outputs_verdict
from .precision import carried_dtypes, is_exact

SCHEMA = "nanhunter.diff/v1"
#: what makes ``nanhunter diff`` exit 1 (``--fail-on``): the outputs differ, or any divergence
FAIL_ON = ("outputs", "divergence")


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
class Region:
    """Entries with no counterpart where the runs part: the ops (or module calls) of each side
    and the innermost module holding both."""

    module: str
    module_type: str
    a: list[str]  # A's ops (level modules: module names), in order
    b: list[str]
    a_index: list[int]
    b_index: list[int]
    source: tuple[str | None, int | None] = (None, None)  # the region's first op's (A's, else B's)


@dataclass(frozen=True)
class Divergence:
    """The first divergence (contract fields, plus where it sits in each file). With ``region``,
    the runs part in entries with no counterpart, and ``verdict`` is the first paired entry after
    them, where the difference was measured."""

    verdict: PairVerdict
    inputs_agree: bool
    region: Region | None = None

    @property
    def module(self) -> str:
        return self.region.module if self.region else self.verdict.a.module

    def to_dict(self) -> dict[str, Any]:
        a, b = self.verdict.a, self.verdict.b

        def side(e: Entry) -> dict[str, Any]:
            return {
                **e.stats.to_dict(),
                "spread": e.spread,
                "dtype": e.dtype,
                "shape": list(e.shape),
                "index": e.index,
            }

        err = self.verdict.rel_err
        r = self.region
        out = {
            "module": r.module if r else a.module,
            "module_type": r.module_type if r else a.module_type,
            "op": None if r else a.op,
            "call_index": a.call_index,
            "input_index": a.input_index,
            "step": a.step,
            "phase": a.phase,
            "source_file": r.source[0] if r else a.source_file,
            "source_line": r.source[1] if r else a.source_line,
            "a": side(a),
            "b": side(b),
            "rel_err": err if math.isfinite(err) else None,
            "classes_differ": math.isinf(err),
            "tolerance": self.verdict.tolerance,
            "inputs_agree": self.inputs_agree,
            "unmatched": {"a": r.a, "b": r.b} if r else None,
        }
        if r:
            out["compared_at"] = {"module": a.module, "op": a.op, "index": a.index}
        return out


@dataclass(repr=False)
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
    outputs: OutputsVerdict | None = None  # None: the trace does not say which entries are the outputs
    fail_on: str = "outputs"
    first_difference: Divergence | None = None  # the first entry whose bits differ while its inputs' do not

    def __repr__(self) -> str:  # the traces' entries would make the dataclass repr tens of kilobytes
        where = self.first_divergence.module if self.first_divergence else None
        eq = self.outputs.equal if self.outputs else None
        return (
            f"<{type(self).__name__} {self.a.path!r} vs {self.b.path!r}: first divergence {where!r}, "
            f"outputs {eq!r}, exit {self.exit_code}>"
        )

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
    def outputs_differ(self) -> bool:
        return self.outputs is not None and self.outputs.equal == "differ"

    @property
    def exit_code(self) -> int:
        if self.one_side_nonfinite or self.outputs_differ:
            return 1
        if self.fail_on == "divergence" or self.outputs is None:  # outputs unknown: as v1.3
            return 1 if self.first_divergence is not None else 0
        return 0

    def to_dict(self) -> dict[str, Any]:
        def fnf(e: Entry | None) -> dict[str, Any] | None:
            return (
                None
                if e is None
                else {"module": e.module, "op": e.op, "index": e.index, "kind": e.stats.kind}
            )

        ua, ub = self.unmatched
        return {
            "schema": SCHEMA,
            "a": {"path": self.a.path, "env": self.a.header.env},
            "b": {"path": self.b.path, "env": self.b.header.env},
            "env_diff": self.env_diff,
            "compared": self.compared,
            "unmatched": {"a": ua, "b": ub},
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "first_difference": self.first_difference.to_dict() if self.first_difference else None,
            "first_nonfinite": {"a": fnf(self.first_nonfinite_a), "b": fnf(self.first_nonfinite_b)},
            "outputs": self.outputs.to_dict() if self.outputs else None,
            "level": self.level,
            "rtol": self.rtol,
            "fail_on": self.fail_on,
            "max_rel_err": self.max_rel_err
            if self.max_rel_err is None or math.isfinite(self.max_rel_err)
            else None,
            "exit_code": self.exit_code,
            "notes": self.notes,
        }


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
        raise NotComparable(
            f"A is a trace at level {a.header.level} and B one at level {b.header.level}: record "
            "both with the same --trace-level"
        )
    na, nb = _names(a), _names(b)
    if na != nb:
        only_a = [n for n in na if n not in set(nb)]
        only_b = [n for n in nb if n not in set(na)]
        what = (
            "; ".join(
                x
                for x in (
                    (f"only in A: {_few(only_a)}" if only_a else ""),
                    (f"only in B: {_few(only_b)}" if only_b else ""),
                )
                if x
            )
            or "in another order"
        )
        raise NotComparable(f"different models: module names differ ({what})")
    sa, sb = a.header.model.get("param_shapes_hash"), b.header.model.get("param_shapes_hash")
    if sa != sb:
        raise NotComparable(
            f"different models: the same module names but other parameter shapes "
            f"({a.header.model.get('parameters')} vs {b.header.model.get('parameters')} parameters)"
        )
    ia, ib = a.header.inputs, b.header.inputs
    if len(ia) != len(ib):
        raise NotComparable(f"different inputs: A ran {len(ia)} input(s), B {len(ib)}")
    for x, y in zip(ia, ib):
        if x.get("hash") != y.get("hash"):
            label = x.get("label") or y.get("label")
            raise NotComparable(
                f"different inputs: input #{x.get('index', '?')}"
                + (f" ({label})" if label else "")
                + f" has hash {x.get('hash')} in A and {y.get('hash')} in B"
            )


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
    outputs: OutputsVerdict | None = None
    first_difference: Divergence | None = None  # where the runs first compute different bits

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
        return bool(v.a.stats.kind) and (v.a.stats.nan > 0, v.a.stats.posinf > 0, v.a.stats.neginf > 0) == (
            fb.stats.nan > 0,
            fb.stats.posinf > 0,
            fb.stats.neginf > 0,
        )


# -- 3.-5. judging --------------------------------------------------------------------------------
def _floor_dtype(a: Any, b: Any) -> str | None:
    """The dtype whose smallest normal is the absolute floor of a pair: the coarser side's."""
    da, db = a.dtype, b.dtype
    if da is None or db is None:
        return da or db
    return da if smallest_normal(da) >= smallest_normal(db) else db


def judge(a: Any, b: Any, rtol: float | None, dtypes: frozenset[str] | None = None) -> PairVerdict:
    """One pair by the one rule (``trace.rule``). ``dtypes``: the dtypes the tolerance is taken
    from (default: both sides' output dtypes). Entries of in-memory recordings that kept their
    tensors (``recordings.Recorded.values``: ``scan --compile``) are compared element by element
    instead (``kernels.compare``: ``error`` is inf where the non-finite classes differ)."""
    tol = tolerance(rtol, tuple(dtypes) if dtypes else (a.dtype, b.dtype), (a.spread, b.spread))
    va, vb = getattr(a, "values", None), getattr(b, "values", None)
    if va is not None and vb is not None:
        c = one_comparison(list(va), list(vb))
        return PairVerdict(a, b, c.error, tol, c)
    return PairVerdict(a, b, rel_err(a.stats, b.stats, _floor_dtype(a, b)), tol)


def first_nonfinite(entries: list[Any]) -> Any:
    first_neg = None
    for e in entries:
        if e.stats.nan or e.stats.posinf:
            return e
        if e.stats.neginf and first_neg is None:
            first_neg = e
    return first_neg


class _Side:
    """One recording's entries, which are paired, and which are exact (op level)."""

    def __init__(self, entries: list[Any], paired: dict[int, int]) -> None:
        self.entries = entries
        self.paired = paired  # index here → A's index of the pair
        self.carried = carried_dtypes(entries)
        self.verdicts: dict[int, PairVerdict] = {}  # by A's index (set once judged)
        self.exact = [self._exact(e) for e in entries]

    def _exact(self, e: Any) -> bool:
        producers = [p for p in (getattr(e, "producers", None) or ()) if p is not None]
        if not producers:  # reads only weights and inputs: the first entry that reads them is named
            return False
        dtypes = (
            e.input_dtypes
            if getattr(e, "input_dtypes", None) is not None
            else [self.entries[p].dtype for p in producers]
        )
        return is_exact(e, dtypes)

    def upstream(self, e: Any) -> tuple[list[int], list[int]]:
        """(A's indices of the paired entries ``e``'s value comes from, this side's unpaired
        entries it went through). A paired exact op stands for its own producers too."""
        paired: list[int] = []
        region: list[int] = []
        seen: set[int] = set()
        stack = [p for p in (getattr(e, "producers", None) or ()) if p is not None]
        while stack:
            p = stack.pop()
            if p in seen or not 0 <= p < len(self.entries):
                continue
            seen.add(p)
            if p in self.paired:
                paired.append(self.paired[p])
                if not self.exact[p]:
                    continue
            else:
                region.append(p)
            stack += [q for q in (getattr(self.entries[p], "producers", None) or ()) if q is not None]
        return paired, sorted(region)


def _common_module(names: list[str]) -> str:
    """The innermost module holding every name (dotted paths; "" is the root)."""
    parts = [n.split(".") if n else [] for n in names]
    if not parts:
        return ""
    common: list[str] = []
    for xs in zip(*parts):
        if any(x != xs[0] for x in xs):
            break
        common.append(xs[0])
    return ".".join(common)


def _region_divergence(
    v: PairVerdict, inputs_ok: bool, a: list[Any], b: list[Any], ra: list[int], rb: list[int]
) -> Divergence:
    ea, eb = [a[i] for i in ra], [b[i] for i in rb]
    module = _common_module([e.module for e in ea + eb])
    types = {e.module_type for e in ea + eb if e.module == module}
    if not types:  # the common module ran none of the ops itself: its type, where the pair knows it
        types = {e.module_type for e in (v.a, v.b) if e.module == module}
    first = (ea or eb)[0]
    return Divergence(
        v,
        inputs_ok,
        Region(
            module,
            next(iter(types)) if len(types) == 1 else "",
            [x.op or x.module for x in ea],
            [x.op or x.module for x in eb],
            [x.index for x in ea],
            [x.index for x in eb],
            (getattr(first, "source_file", None), getattr(first, "source_line", None)),
        ),
    )


def bitwise(v: PairVerdict) -> bool:
    """The two sides of a pair hold the same bits (same hash, dtype and shape), or differ only as
    much as their own re-runs do (``--repeat`` spread, within tolerance)."""
    a, b = v.a, v.b
    if (
        a.stats.hash is not None
        and a.stats.hash == b.stats.hash
        and a.dtype == b.dtype
        and tuple(a.shape) == tuple(b.shape)
    ):
        return True
    return v.agrees and max(a.spread or 0.0, b.spread or 0.0) > 0


def _same_inputs(e: Any, f: Any, v: PairVerdict) -> bool | None:
    """Module level: whether the call's recorded inputs agree by the rule (None: not recorded)."""
    if e.input is None or f.input is None:
        return None
    return rel_err(e.input, f.input, _floor_dtype(e, f)) <= v.tolerance


def _same_input_bits(e: Any, f: Any, v: PairVerdict) -> bool | None:
    """Module level: whether the call's recorded inputs hold the same bits (None: not recorded)."""
    if e.input is None or f.input is None or e.input.hash is None:
        return None
    return e.input.hash == f.input.hash


def _walk(
    level: str,
    a: list[Any],
    b: list[Any],
    pairs: list[Pair],
    sa: _Side,
    sb: _Side,
    agrees: dict[int, bool],
    same_inputs: Any,
    fallback_too: bool,
) -> tuple[Divergence | None, bool]:
    """The first pair (A's order) that does not ``agree`` while its inputs do (``same_inputs``
    at level modules), as a ``Divergence`` (a ``Region`` when unpaired entries lead to it); with
    ``fallback_too``, else the first that does not agree, with ``inputs_agree`` false. Returns
    (it, whether it is the fallback)."""
    fallback: Divergence | None = None
    prev_agrees = True
    prev_a = prev_b = -1
    for ia, ib in pairs:
        v = sa.verdicts[ia]
        ra: list[int] = []
        rb: list[int] = []
        if level == "ops":
            if agrees[ia] or sa.exact[ia] or sb.exact[ib]:
                continue  # only a pair that differs needs its inputs looked at
            up_a, ra = sa.upstream(v.a)
            up_b, rb = sb.upstream(v.b)
            inputs_ok = all(agrees[p] for p in set(up_a) | set(up_b))
        else:
            ra = [i for i in range(prev_a + 1, ia) if i not in sa.paired]
            rb = [i for i in range(prev_b + 1, ib) if i not in sb.paired]
            same = same_inputs(v.a, v.b, v)
            inputs_ok = prev_agrees if same is None else same
            prev_a, prev_b = ia, max(prev_b, ib)
        if not agrees[ia]:
            if inputs_ok:
                return (
                    _region_divergence(v, True, a, b, ra, rb) if (ra or rb) else Divergence(v, True)
                ), False
            if fallback is None and fallback_too:
                fallback = Divergence(v, False)
        prev_agrees = agrees[ia]
    return fallback, fallback is not None


def compare_recordings(
    a: list[Any], b: list[Any], level: str = "modules", rtol: float | None = None
) -> RecordingsComparison:
    """Align two recordings (trace entries or ``recordings.Recorded``), judge every pair and find
    the first divergence (beyond tolerance), the first difference (bitwise), each side's first
    non-finite entry and the outputs' verdict."""
    pairs = align(level, a, b)
    sa, sb = _Side(a, {ia: ia for ia, _ in pairs}), _Side(b, {ib: ia for ia, ib in pairs})
    verdicts: dict[int, PairVerdict] = {
        ia: judge(a[ia], b[ib], rtol, sa.carried[ia] | sb.carried[ib]) for ia, ib in pairs
    }
    sa.verdicts = sb.verdicts = verdicts
    notes: list[str] = []
    first, fell_back = _walk(
        level, a, b, pairs, sa, sb, {i: v.agrees for i, v in verdicts.items()}, _same_inputs, True
    )
    if fell_back:
        notes.append(
            "every entry that differs beyond tolerance has inputs that differ too (each judged in its own "
            "precision): the first of them is shown, with inputs_agree false"
        )
    difference, _ = _walk(
        level, a, b, pairs, sa, sb, {i: bitwise(v) for i, v in verdicts.items()}, _same_input_bits, False
    )
    finite_errs = [v.rel_err for v in verdicts.values() if math.isfinite(v.rel_err)]
    outputs, out_note = outputs_verdict(a, b, level, pairs, verdicts)
    if out_note:
        notes.append(out_note)
    return RecordingsComparison(
        pairs,
        verdicts,
        first,
        first_nonfinite(a),
        first_nonfinite(b),
        max(finite_errs) if finite_errs else None,
        notes,
        outputs,
        difference,
    )


def compare_traces(a: Trace, b: Trace, rtol: float | None = None, fail_on: str = "outputs") -> DiffResult:
    """A against B: see the module docstring. ``fail_on``: ``"outputs"`` or ``"divergence"``."""
    if rtol is not None and not (isinstance(rtol, (int, float)) and math.isfinite(rtol) and rtol > 0):
        raise BadInput(f"--rtol {rtol!r}: give a positive number such as 1e-3")
    if fail_on not in FAIL_ON:
        raise BadInput(f"--fail-on {fail_on!r}: give one of {', '.join(FAIL_ON)}")
    check_comparable(a, b)
    level = a.header.level
    if level == "modules":
        for ia, ib in align(level, a.entries, b.entries):
            ea, eb = a.entries[ia], b.entries[ib]
            if ea.shape != eb.shape:
                raise NotComparable(
                    f"different inputs or models: {ea.module or '<root>'} (call {ea.call_index}, "
                    f"input {ea.input_index}, step {ea.step}) returns shape {list(ea.shape)} in A and "
                    f"{list(eb.shape)} in B"
                )
    cmp = compare_recordings(a.entries, b.entries, level, rtol)
    notes = list(cmp.notes)
    ua, ub = len(a.entries) - len(cmp.pairs), len(b.entries) - len(cmp.pairs)
    if ua or ub:
        notes.append(
            f"{ua} entr{'y' if ua == 1 else 'ies'} of A and {ub} of B have no counterpart (fused, hidden "
            "in a compiled region, or present in one version only): each is judged at the first paired "
            "entry after it"
        )
    ca, cb = a.header.env.get("compile"), b.header.env.get("compile")
    if ca != cb:
        sides = [(s, c, t) for s, c, t in (("A", ca, a), ("B", cb, b)) if c]
        opaque = [
            f"{s} ran under torch.compile ({c})"
            for s, c, t in sides
            if all(e.module == "" for e in t.entries)
        ]
        alone = [s for s, c, t in sides if any(e.module != "" for e in t.entries)]
        if alone:
            notes.append(
                f"{' and '.join(alone)} ran under torch.compile: each module call is recorded as that module "
                "compiled alone on eager's inputs (its module boundaries), so the module named is where "
                "compile changed the numbers"
            )
        if opaque:
            notes.append(
                f"{' and '.join(opaque)}: module calls inside a compiled region are not seen, so the "
                "divergence is named at the nearest call outside it; `nanhunter scan --compile` searches "
                "the module where compiled and eager part (compile.first_divergent_module)"
            )
    return DiffResult(
        a,
        b,
        level,
        rtol,
        env_diff(a.header.env, b.header.env),
        cmp.pairs,
        cmp.first_divergence,
        cmp.first_nonfinite_a,
        cmp.first_nonfinite_b,
        cmp.max_rel_err,
        notes,
        cmp.outputs,
        fail_on,
        cmp.first_difference,
    )


def plot_series(res: DiffResult) -> dict[str, Any]:
    """What the HTML plot draws: A's absmax per entry, B's at the entries paired with them, the
    A positions of non-finite entries on each side, and the divergence's A index."""
    b_of = dict(res.pairs)
    a_vals = [e.stats.absmax for e in res.a.entries]
    b_vals = [res.b.entries[b_of[i]].stats.absmax if i in b_of else None for i in range(len(res.a.entries))]
    bad_a = [e.index for e in res.a.entries if e.stats.kind is not None]
    bad_b = [
        i for i in range(len(res.a.entries)) if i in b_of and res.b.entries[b_of[i]].stats.kind is not None
    ]
    mark = res.first_divergence.verdict.a.index if res.first_divergence else None
    return {"a": a_vals, "b": b_vals, "bad_a": bad_a, "bad_b": bad_b, "mark": mark}
