"""The mechanism oracle: which IEEE 754 rule made the first non-finite element of a run, derived
without nanhunter (it shares no code with it; ``tests/unit/test_oracle_independent.py``).

``first_new(fn)`` runs ``fn`` under its own ``TorchDispatchMode`` and keeps the first aten op whose
output holds a non-finite class (NaN, +inf, −inf) that none of its operands held (a −inf alone is
kept aside, as masks write it on purpose, and taken only when no op makes NaN/+inf). ``classify``
reads that op's operands at the first element of the new class, with Python floats:

- the op recomputed in float64 is finite there → ``overflow`` (the op's dtype could not hold it);
- else, by the rule that makes it: a product 0·∞ (``0*inf``, in a matmul's dot product too), a sum
  of +∞ and −∞ (``inf-inf``), a quotient 0/0, x/0, ∞/∞, log of 0 (``log(0)``), a function outside
  its domain (``domain``), a mean or variance over too few elements (``empty_reduction``), a
  softmax row all −∞ (``all_masked_row``), a normalisation (layer, batch, group norm) dividing by
  sqrt(var + eps) = 0 (``0*inf`` where x − mean = 0, ``x/0`` elsewhere) or taking the root of a
  negative (``domain``), or an operand already non-finite (``nonfinite_operand``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass
class Event:
    op: str  # the overload packet's name: "div", "mm", "nll_loss_forward"
    args: tuple
    kwargs: dict
    out: torch.Tensor
    new: str  # nan | posinf | neginf


def _classes(ts: list[torch.Tensor]) -> set[str]:
    got = set()
    for t in ts:
        f = t.detach().double()
        if bool(torch.isnan(f).any()):
            got.add("nan")
        if bool((f == math.inf).any()):
            got.add("posinf")
        if bool((f == -math.inf).any()):
            got.add("neginf")
    return got


def _float_tensors(obj: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(obj)
    return [t for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _scalar_classes(obj: Any) -> set[str]:
    flat, _ = tree_flatten(obj)
    got = set()
    for x in flat:
        if isinstance(x, float):
            if math.isnan(x):
                got.add("nan")
            elif x == math.inf:
                got.add("posinf")
            elif x == -math.inf:
                got.add("neginf")
    return got


class _Watch(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.first: Event | None = None
        self.neginf: Event | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = None
        if self.first is None and func._schema.is_mutable:
            before = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
        out = func(*args, **kwargs)
        if self.first is not None:
            return out
        a = before if before is not None else args
        outs = _float_tensors(out)
        if not outs:
            return out
        had = _classes(_float_tensors((a, kwargs))) | _scalar_classes((a, kwargs))
        new = _classes(outs) - had
        if new:
            kind = "nan" if "nan" in new else "posinf" if "posinf" in new else "neginf"
            ev = Event(func._opname, a, kwargs, outs[0].detach().clone(), kind)
            if kind == "neginf":
                self.neginf = self.neginf or ev
            else:
                self.first = ev
        return out


def first_new(fn) -> Event | None:
    """The first op of ``fn()`` that made a new non-finite class (see the module docstring)."""
    w = _Watch()
    with w:
        fn()
    return w.first or w.neginf


def _index(t: torch.Tensor, kind: str) -> int:
    f = t.detach().double().reshape(-1)
    mask = torch.isnan(f) if kind == "nan" else f == (math.inf if kind == "posinf" else -math.inf)
    return int(torch.nonzero(mask)[0, 0])


def _at(x: Any, shape: torch.Size, i: int) -> float:
    if isinstance(x, torch.Tensor):
        return float(x.double().expand(shape).reshape(-1)[i])
    return float(x)


def _wide(x: Any) -> Any:
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _normalised(vals: list[float], x: float, mean: float, var: float, eps: float) -> str | None:
    """(x − mean) / sqrt(var + eps), in Python floats: a root of a negative, or of zero times 0 or not."""
    if not all(math.isfinite(v) for v in [*vals, x, mean, var]):
        return "nonfinite_operand"
    d = var + eps
    if d < 0:
        return "domain"
    if d == 0:
        return "0*inf" if x - mean == 0.0 else "x/0"
    return None


def _normalisation(op: str, a: tuple, i: int) -> str | None:
    """Batch norm (running statistics in eval, the channel's biased ones in training) and group norm
    (the biased statistics of the element's group), at flat output index ``i``."""
    x = a[0].double()
    flat = x.reshape(-1).tolist()
    if op == "native_group_norm":
        n_, c_, hw, groups, eps = a[3], a[4], a[5], a[6], a[7]
        n, c = i // (c_ * hw), (i // hw) % c_
        per = (c_ // groups) * hw
        g = c // (c_ // groups)
        vals = x.reshape(n_, groups, per)[n, g].tolist()
        train = True
    else:
        train = bool(a[5]) if op == "native_batch_norm" else False
        eps = a[-1]
        c_, hw = x.shape[1], math.prod(x.shape[2:])
        c = (i // hw) % c_
        vals = x.transpose(0, 1)[c].reshape(-1).tolist()
    if train:
        if not vals:
            return "empty_reduction"
        mean = math.fsum(vals) / len(vals)
        var = math.fsum((v - mean) ** 2 for v in vals) / len(vals)
    else:
        mean, var, vals = float(a[3][c]), float(a[4][c]), []
    return _normalised(vals, flat[i], mean, var, eps)


def classify(ev: Event) -> str | None:
    """The mechanism of ``ev``'s first element of its new class, by IEEE rules."""
    i = _index(ev.out, ev.new)
    shape = ev.out.shape
    op = ev.op.rstrip("_")
    func = getattr(torch.ops.aten, ev.op)
    wide = [_wide(a) for a in ev.args]
    kw = {k: (torch.float64 if isinstance(v, torch.dtype) else _wide(v)) for k, v in ev.kwargs.items()}
    try:
        r = func(*wide, **kw)
        r = r[0] if isinstance(r, (tuple, list)) else r
        exact = float(r.reshape(-1)[i])
    except (RuntimeError, TypeError):
        exact = math.nan
    if math.isfinite(exact):
        return "overflow"
    a = ev.args
    if op in ("mul",):
        x, y = _at(a[0], shape, i), _at(a[1], shape, i)
        if {x, y} & {0.0} and (math.isinf(x) or math.isinf(y)):
            return "0*inf"
    if op in ("add", "sub"):
        x, y = _at(a[0], shape, i), _at(a[1], shape, i)
        y = -y if op == "sub" else y
        if math.isinf(x) and math.isinf(y) and x != y:
            return "inf-inf"
    if op == "div":
        x, y = _at(a[0], shape, i), _at(a[1], shape, i)
        if math.isinf(x) and math.isinf(y):
            return "inf/inf"
        if y == 0.0:
            return "0/0" if x == 0.0 else "x/0"
    if op == "reciprocal" and _at(a[0], shape, i) == 0.0:
        return "x/0"
    if op in ("log", "log2", "log10"):
        x = _at(a[0], shape, i)
        return "log(0)" if x == 0.0 else "domain" if x < 0 else None
    if op in ("sqrt", "acos", "asin"):
        return "domain"
    if op == "exp":
        return "overflow"
    if op in ("mm", "matmul", "addmm", "bmm"):
        x, y = (a[1], a[2]) if op == "addmm" else (a[0], a[1])
        n = shape[-1]
        row, col = x.double()[i // n], y.double()[:, i % n]
        for p, q in zip(row.tolist(), col.tolist()):
            if (p == 0.0 and math.isinf(q)) or (q == 0.0 and math.isinf(p)):
                return "0*inf"
        prods = [p * q for p, q in zip(row.tolist(), col.tolist())]
        if math.inf in prods and -math.inf in prods:
            return "inf-inf"
    if op in ("mean", "var", "std"):
        x = a[0]
        dims = a[1] if len(a) > 1 and a[1] is not None else list(range(x.dim()))
        dims = [dims] if isinstance(dims, int) else list(dims)
        n = math.prod(x.shape[d] for d in dims)
        corr = ev.kwargs.get("correction", 1 if op != "mean" else 0)
        if n == 0 or (op != "mean" and n <= corr):
            return "empty_reduction"
    if op == "sum":
        vals = a[0].double().reshape(-1).tolist()
        if math.inf in vals and -math.inf in vals:
            return "inf-inf"
    if op in ("_softmax", "_log_softmax"):
        x, dim = a[0].double(), a[1]
        rows = x.movedim(dim, -1).reshape(-1, x.shape[dim])
        idx = torch.arange(x.numel()).reshape(x.shape).movedim(dim, -1).reshape(-1, x.shape[dim])
        row = rows[(idx == i).any(-1)][0]
        if bool((row == -math.inf).all()):
            return "all_masked_row"
    if op == "native_layer_norm":
        x = a[0].double()
        n = math.prod(a[1])
        row = x.reshape(-1, n)[i // n]
        if bool((row == 0).all()) and a[-1] == 0:
            return "0*inf"
    if op in ("native_batch_norm", "_native_batch_norm_legit_no_training", "native_group_norm"):
        return _normalisation(op, a, i)
    if op == "nll_loss_forward":
        target, ignore = a[1], a[4]
        if a[3] == 1 and bool((target == ignore).all()):
            return "empty_reduction"
    flat, _ = tree_flatten(a)
    if any(
        isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())
        for t in flat
    ):
        return "nonfinite_operand"
    return None
