"""Where two runs part, derived without nanhunter: an own per-op (or per-module) tape of a run and
the contract's rules (v1.4, "Where two runs part, judged in the runs' own precision") applied to
two tapes, for holding ``nanhunter diff`` to them (tests/integration/test_diff_oracle.py).

**The tape** (``Tape(model, level)``, a context manager around one forward):

- ops: a ``TorchDispatchMode``; a module stack from global module hooks (dotted names from
  ``named_modules``, a per-name call counter). An op is written down when it returns a floating
  tensor and runs inside a module call. An op whose floating output shares storage with one of its
  operands (a view, an alias; not an in-place op, whose name ends in ``_``) or is a same-dtype copy of an operand by name (``clone``,
  ``contiguous``, ``detach``, a ``_to_copy`` that keeps the dtype) is no entry: its output is the
  operand's. Operands are traced to the entry that made them by their storage's address (every
  output is held until the tape ends, so no address is reused). Factories that write nothing
  (``empty*``) are skipped.
- modules: forward hooks; an entry per module call in completion order, with the statistics of
  its floating inputs too.
- statistics in float64 over the finite values: absmax, mean, l2; non-finite classes; the
  SHA-1 of dtype, shape and bytes (equal bits, equal digest).

**The verdict** (``part(a, b)``): entries paired per call (module, call number) by a
longest-common-subsequence table over (op, shape) (the tool uses difflib; ties may pair
differently, which the cells avoid); ``rel_err`` = max over absmax, mean (on the absmax scale)
and l2 of |a − b| / max(|a|, |b|), a difference below ``torch.finfo(dtype).tiny`` agreeing;
tolerance 1e-2 when any dtype the value went through (its own, its operands', its producers' on
both sides) is 16 bits or narrower, else 1e-3; exact ops (a widening cast, copy, concatenation,
indexing — with at least one traced operand) never the first divergence; unpaired entries judged
at the first paired entry after them (ops: through the producers; modules: in completion order).
``first_difference`` is the same walk with "the same bits" for "agrees". ``outputs``: the tensors
the model returned, compared directly.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

COPIES = {"clone", "contiguous", "detach", "alias", "lift_fresh", "lift_fresh_copy", "_to_copy", "to"}
BLANK = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
EXACT = {
    "cat",
    "concat",
    "stack",
    "index",
    "_unsafe_index",
    "index_select",
    "gather",
    "embedding",
    "copy",
    "copy_",
    "_to_copy",
    "repeat",
    "slice_scatter",
    "select_scatter",
}


def _floats(obj: Any) -> list[torch.Tensor]:
    if hasattr(obj, "to_tuple") and not isinstance(obj, torch.Tensor):
        obj = obj.to_tuple()
    leaves, _ = tree_flatten(obj)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


@dataclass
class Stat:
    absmax: float | None
    mean: float | None
    l2: float
    classes: tuple[bool, bool, bool]
    digest: str


def stat(ts: list[torch.Tensor]) -> Stat:
    h = hashlib.sha1()
    n, total, sq, mx = 0, 0.0, 0.0, None
    nan = pinf = ninf = False
    for t in ts:
        x = t.detach().to("cpu")
        h.update(f"{x.dtype}|{tuple(x.shape)}|".encode())
        h.update(x.contiguous().view(torch.uint8).numpy().tobytes() if x.numel() else b"")
        d = x.double()
        nan |= bool(d.isnan().any())
        pinf |= bool((d == math.inf).any())
        ninf |= bool((d == -math.inf).any())
        f = d[d.isfinite()]
        if f.numel():
            n += f.numel()
            total += float(f.sum())
            sq += float((f * f).sum())
            m = float(f.abs().max())
            mx = m if mx is None else max(mx, m)
    return Stat(mx, total / n if n else None, math.sqrt(sq), (nan, pinf, ninf), h.hexdigest())


@dataclass
class Entry:
    index: int
    module: str
    call: int
    op: str | None
    shape: tuple[int, ...]
    dtype: torch.dtype
    out: Stat
    srcs: list[int | None] = field(default_factory=list)
    in_dtypes: set = field(default_factory=set)
    inp: Stat | None = None


class Tape(TorchDispatchMode):
    """One forward's entries (module docstring). ``level``: "ops" or "modules"."""

    def __init__(self, model: torch.nn.Module, level: str = "ops") -> None:
        super().__init__()
        self.level = level
        self.names = {m: n for n, m in model.named_modules()}
        self.stack: list[tuple[str, int]] = []
        self.calls: dict[str, int] = {}
        self.entries: list[Entry] = []
        self.made: dict[int, int] = {}  # storage address → entry
        self.keep: list[torch.Tensor] = []
        self.inputs: dict[int, Stat] = {}

    # module stack and module-level entries
    def _pre(self, mod, args, kwargs=None):
        name = self.names.get(mod)
        if name is None:
            return
        k = self.calls.get(name, 0)
        self.calls[name] = k + 1
        self.stack.append((name, k))
        if self.level == "modules":
            with torch.utils._python_dispatch._disable_current_modes():
                self.inputs[len(self.stack)] = stat(_floats((args, kwargs or {})))

    def _post(self, mod, args, out):
        name = self.names.get(mod)
        if name is None or not self.stack or self.stack[-1][0] != name:
            return
        depth = len(self.stack)
        _, k = self.stack.pop()
        if self.level == "modules":
            fl = _floats(out)
            if fl:
                self.entries.append(
                    Entry(
                        len(self.entries),
                        name,
                        k,
                        None,
                        tuple(fl[0].shape),
                        fl[0].dtype,
                        stat(fl),
                        inp=self.inputs.pop(depth, None),
                    )
                )

    def __enter__(self):
        self._h = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._pre),
            torch.nn.modules.module.register_module_forward_hook(self._post),
        ]
        return super().__enter__() if self.level == "ops" else self

    def __exit__(self, *exc):
        for h in self._h:
            h.remove()
        if self.level == "ops":
            return super().__exit__(*exc)
        return None

    def _addr(self, t: torch.Tensor) -> int | None:
        try:
            return t.untyped_storage().data_ptr()
        except Exception:  # noqa: BLE001 - a tensor without storage
            return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.stack:
            return out
        name = func.__name__.split(".")[0]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        fl = [t for t in outs if t.is_floating_point()]
        ins = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
        if not fl or name in BLANK:
            return out
        in_addr = {self._addr(t) for t in ins}
        if self._addr(fl[0]) in in_addr and not name.endswith("_"):
            return out  # a view: its storage is its operand's (an in-place op writes new values: an entry)
        if name in COPIES and ins and fl[0].dtype == ins[0].dtype:
            src = self.made.get(self._addr(ins[0]))
            for t in fl:
                if src is not None:
                    self.made[self._addr(t)] = src
            self.keep += fl
            return out
        mod, k = self.stack[-1]
        e = Entry(
            len(self.entries),
            mod,
            k,
            str(func),
            tuple(fl[0].shape),
            fl[0].dtype,
            stat(fl),
            [self.made.get(self._addr(t)) for t in ins],
            {t.dtype for t in ins if t.is_floating_point()},
        )
        self.entries.append(e)
        for t in fl:
            self.made[self._addr(t)] = e.index
        self.keep += fl
        return out


# ---------------------------------------------------------------------------------------------
def rel_err(x: Stat, y: Stat, floor: float) -> float:
    if x.classes != y.classes:
        return math.inf
    worst = 0.0
    scale = max(abs(x.absmax or 0.0), abs(y.absmax or 0.0))
    for p, q, den in (
        (x.absmax, y.absmax, scale),
        (x.l2, y.l2, max(abs(x.l2), abs(y.l2))),
        (x.mean, y.mean, max(abs(x.mean or 0.0), abs(y.mean or 0.0), scale)),
    ):
        if p is None and q is None:
            continue
        if p is None or q is None:
            return math.inf
        if abs(p - q) < floor:
            continue
        worst = max(worst, abs(p - q) / den if den > 0 else math.inf)
    return worst


def _narrow(d: torch.dtype) -> bool:
    return d.is_floating_point and torch.finfo(d).bits <= 16


def _holds(dst: torch.dtype, src: torch.dtype) -> bool:
    a, b = torch.finfo(dst), torch.finfo(src)
    return a.max >= b.max and a.eps <= b.eps and a.tiny <= b.tiny


def _lcs(xs: list, ys: list) -> list[tuple[int, int]]:
    n, m = len(xs), len(ys)
    t = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            t[i][j] = t[i + 1][j + 1] + 1 if xs[i] == ys[j] else max(t[i + 1][j], t[i][j + 1])
    out, i, j = [], 0, 0
    while i < n and j < m:
        if xs[i] == ys[j]:
            out.append((i, j))
            i, j = i + 1, j + 1
        elif t[i + 1][j] >= t[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


def pair(a: list[Entry], b: list[Entry]) -> dict[int, int]:
    """A's index → B's index."""
    if not a or a[0].op is None:
        where = {(e.module, e.call): e.index for e in b}
        return {e.index: where[(e.module, e.call)] for e in a if (e.module, e.call) in where}
    ga: dict[tuple, list[Entry]] = {}
    gb: dict[tuple, list[Entry]] = {}
    for e in a:
        ga.setdefault((e.module, e.call), []).append(e)
    for e in b:
        gb.setdefault((e.module, e.call), []).append(e)
    out = {}
    for key, xs in ga.items():
        ys = gb.get(key, [])
        for i, j in _lcs([(e.op, e.shape) for e in xs], [(e.op, e.shape) for e in ys]):
            out[xs[i].index] = ys[j].index
    return out


@dataclass
class Parting:
    """Where two tapes part: ``(module, op)`` (op None for a module entry or a region) and, for a
    region, the two sides' unpaired ops."""

    module: str
    op: str | None
    unmatched: tuple[list[str], list[str]] | None


@dataclass
class Verdict:
    divergence: Parting | None
    difference: Parting | None
    outputs: str  # "bitwise" | "within_tolerance" | "differ"


def _carried(es: list[Entry]) -> list[set]:
    out: list[set] = []
    for e in es:
        s = {e.dtype} | set(e.in_dtypes)
        for p in e.srcs:
            if p is not None:
                s |= out[p]
        out.append(s)
    return out


def _exact(e: Entry, es: list[Entry]) -> bool:
    if e.op is None or not any(p is not None for p in e.srcs):
        return False
    name = e.op.split(".")[1]
    if name not in EXACT:
        return False
    return all(
        _holds(e.dtype, d) if name in ("_to_copy", "copy", "copy_") else d == e.dtype for d in e.in_dtypes
    )


def _common(names: list[str]) -> str:
    split = [n.split(".") if n else [] for n in names]
    out = []
    for parts in zip(*split):
        if len(set(parts)) > 1:
            break
        out.append(parts[0])
    return ".".join(out)


def part(a: list[Entry], b: list[Entry]) -> Verdict:
    """Where tape ``a`` and tape ``b`` part (module docstring); the outputs verdict is left to
    ``outputs``, so ``Verdict.outputs`` is filled by the caller."""
    ab = pair(a, b)
    ba = {j: i for i, j in ab.items()}
    ca, cb = _carried(a), _carried(b)
    tol, err, same = {}, {}, {}
    for i, j in ab.items():
        x, y = a[i], b[j]
        tol[i] = 1e-2 if any(_narrow(d) for d in ca[i] | cb[j]) else 1e-3
        floor = max(torch.finfo(x.dtype).tiny, torch.finfo(y.dtype).tiny)
        err[i] = rel_err(x.out, y.out, floor)
        same[i] = x.out.digest == y.out.digest
    ops = bool(a) and a[0].op is not None

    def upstream(es: list[Entry], e: Entry, paired: dict[int, int]) -> tuple[set, list[int]]:
        seen, hit, region, todo = set(), set(), [], [p for p in e.srcs if p is not None]
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            if p in paired:
                hit.add(paired[p])
                if not _exact(es[p], es):
                    continue
            else:
                region.append(p)
            todo += [q for q in es[p].srcs if q is not None]
        return hit, sorted(region)

    def walk(agree: dict[int, bool], inputs_same) -> Parting | None:
        prev_ok, last_a, last_b = True, -1, -1
        fallback = None
        for i in sorted(ab):
            j = ab[i]
            if ops:
                ua, ra = upstream(a, a[i], {k: k for k in ab})
                ub, rb = upstream(b, b[j], ba)
                ok = all(agree[k] for k in ua | ub)
                if _exact(a[i], a) or _exact(b[j], b):
                    continue
            else:
                ra = [k for k in range(last_a + 1, i) if k not in ab]
                rb = [k for k in range(last_b + 1, j) if k not in ba]
                s = inputs_same(a[i], b[j], tol[i])
                ok = prev_ok if s is None else s
                last_a, last_b = i, max(last_b, j)
            if not agree[i]:
                if ok:
                    if ra or rb:
                        ea, eb = [a[k] for k in ra], [b[k] for k in rb]
                        return Parting(
                            _common([e.module for e in ea + eb]),
                            None,
                            ([e.op or e.module for e in ea], [e.op or e.module for e in eb]),
                        )
                    return Parting(a[i].module, a[i].op, None)
                if fallback is None and inputs_same is not _bits_same:
                    fallback = Parting(a[i].module, a[i].op, None)
            prev_ok = agree[i]
        return fallback

    def _stats_same(x: Entry, y: Entry, t: float) -> bool | None:
        if x.inp is None or y.inp is None:
            return None
        return rel_err(x.inp, y.inp, max(torch.finfo(x.dtype).tiny, torch.finfo(y.dtype).tiny)) <= t

    def _bits_same(x: Entry, y: Entry, t: float) -> bool | None:
        return None if x.inp is None or y.inp is None else x.inp.digest == y.inp.digest

    div = walk({i: err[i] <= tol[i] for i in ab}, _stats_same)
    dif = walk(same, _bits_same)
    return Verdict(div, dif, "")


def outputs(x: torch.Tensor, y: torch.Tensor) -> str:
    """The returned tensors: the same bits, within the tolerance of their dtypes, or not."""
    sx, sy = stat([x]), stat([y])
    if sx.digest == sy.digest:
        return "bitwise"
    t = 1e-2 if _narrow(x.dtype) or _narrow(y.dtype) else 1e-3
    floor = max(torch.finfo(x.dtype).tiny, torch.finfo(y.dtype).tiny)
    return "within_tolerance" if rel_err(sx, sy, floor) <= t else "differ"


def compiled_alone(model: torch.nn.Module, x: torch.Tensor, backend: str = "inductor") -> list[Entry]:
    """A compiled run's module entries as the contract has them recorded: every module call of an
    eager run (completion order), each computed by its module compiled alone, fed a copy of the
    inputs eager gave it. Compile state is reset around each compile (modules of one class share
    their forward's code, and the recompile limit would run later ones eagerly)."""
    import torch._dynamo

    names = {m: n for n, m in model.named_modules()}
    seen: list[tuple[str, int, torch.nn.Module, tuple, dict]] = []
    open_: list[tuple[str, int, torch.nn.Module, tuple, dict]] = []
    count: dict[str, int] = {}

    def pre(mod, args, kwargs):
        n = names[mod]
        k = count.get(n, 0)
        count[n] = k + 1
        open_.append(
            (
                n,
                k,
                mod,
                tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args),
                {key: v.clone() if isinstance(v, torch.Tensor) else v for key, v in kwargs.items()},
            )
        )

    def post(mod, args, kwargs, out):
        item = open_.pop()
        if item[0]:
            seen.append(item)

    hs = []
    for m in names:
        hs.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        hs.append(m.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hs:
            h.remove()
    out = []
    for name, k, mod, args, kwargs in seen:
        torch._dynamo.reset()
        with torch.no_grad():
            y = torch.compile(mod, backend=backend)(*args, **kwargs)
        fl = _floats(y)
        out.append(
            Entry(
                len(out),
                name,
                k,
                None,
                tuple(fl[0].shape),
                fl[0].dtype,
                stat(fl),
                inp=stat(_floats((args, kwargs))),
            )
        )
    torch._dynamo.reset()
    return out
