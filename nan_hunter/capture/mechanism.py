"""How IEEE arithmetic made an op's first non-finite element (contract v1.4 ``diagnosis.mechanism``).

``mechanism_of(func, args, kwargs, out, prefer)`` finds the first element of the op's output
holding the newly made class (``prefer``: "nan", "posinf" or "neginf"), re-runs the op on its
operands widened to float64, and reads the operands that made that element:

- the float64 result there is finite: the op's own dtype could not hold it (``overflow``, an
  intermediate of a norm or a softmax included);
- else, by op family: pointwise (``0*inf``, ``inf-inf``, ``0/0``, ``x/0``, ``inf/inf``,
  ``log(0)``, ``domain``, ``overflow``), matmuls (the products and the sum that make the element),
  reductions (``empty_reduction``: a mean over nothing, a variance with correction ≥ n), softmax
  and logsumexp (``all_masked_row``), norms (layer, RMS, batch — running or batch statistics —
  and group norm: ``0*inf``, ``x/0``, ``domain`` under the root), losses (``nll_loss`` with every target ignored), and
  ``nonfinite_operand`` when the element's own operands were non-finite.

None only when the op cannot be evaluated (no float64/float32 kernel, a tensor subclass, an
``out=`` buffer) or its semantics are not known here (``explain.facts.why_unknown`` says which).
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..kernels.reference import Unreadable, plain


class Mechanism(StrEnum):
    """The IEEE mechanism of the first non-finite element (string values: the report's)."""

    OVERFLOW = "overflow"
    X_DIV_0 = "x/0"
    ZERO_DIV_0 = "0/0"
    INF_DIV_INF = "inf/inf"
    ZERO_TIMES_INF = "0*inf"
    INF_MINUS_INF = "inf-inf"
    LOG_0 = "log(0)"
    DOMAIN = "domain"
    EMPTY_REDUCTION = "empty_reduction"
    ALL_MASKED_ROW = "all_masked_row"
    NONFINITE_OPERAND = "nonfinite_operand"
    UNINITIALISED_READ = "uninitialised_read"


M = Mechanism

MUL = {"mul", "mul_", "multiply"}
ADD = {"add", "add_", "sub", "sub_", "subtract", "rsub"}
DIV = {"div", "div_", "true_divide", "divide", "floor_divide"}
RECIP = {"reciprocal", "reciprocal_", "rsqrt", "rsqrt_"}
LOGS = {"log", "log_", "log2", "log10", "log1p", "log1p_"}
ROOTS = {"sqrt", "sqrt_"}
POW = {"pow", "pow_", "float_power"}
ARC = {"acos", "asin", "atanh", "acosh", "erfinv", "acos_", "asin_", "atanh_"}
EXPS = {"exp", "exp_", "exp2", "expm1", "sinh", "cosh", "tan"}
MATMUL = {"mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "dot", "mv", "addmv", "addbmm"}
MEANS = {"mean", "nanmean"}
VARS = {"var", "std", "var_mean", "std_mean"}
SUMS = {"sum", "nansum", "prod", "cumsum", "linalg_vector_norm", "norm"}
SOFTMAX = {"_softmax", "softmax", "_log_softmax", "log_softmax", "logsumexp", "_safe_softmax"}
NORMS = {"native_layer_norm", "layer_norm", "_fused_rms_norm", "rms_norm"}
#: batch norm (its running statistics in eval, the batch's per channel in training) and group norm
BATCH_NORMS = {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training"}
GROUP_NORMS = {"native_group_norm"}
NLL = {"nll_loss_forward", "nll_loss", "nll_loss2d_forward", "nll_loss_nd", "cross_entropy_loss"}


def _name(func: Any) -> str:
    name = getattr(func, "_opname", None) or str(func).split(".")[-2 if str(func).count(".") >= 2 else -1]
    return str(name)


def _floats(obj: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(obj)
    return [t for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _first(t: torch.Tensor, prefer: str | None) -> int | None:
    """Flat index of the first element of class ``prefer`` (any non-finite one when absent)."""
    f = t.detach().reshape(-1)
    if f.dtype.itemsize == 1:
        f = f.float()
    masks = {"nan": torch.isnan(f), "posinf": f == math.inf, "neginf": f == -math.inf}
    mask = masks.get(prefer) if prefer in masks else None
    if mask is None or not bool(mask.any()):
        mask = ~torch.isfinite(f)
    hit = torch.nonzero(mask)
    return int(hit[0, 0]) if hit.numel() else None


def _widen(obj: Any, dt: torch.dtype) -> Any:
    def w(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return plain(x).detach().to(dt, copy=True)  # a copy: an in-place op re-run writes into it
        if isinstance(x, torch.dtype) and x.is_floating_point:
            return dt
        return x

    return tree_map(w, obj)


def rerun_wide(func: Any, args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], tuple, dict] | None:
    """``func`` re-run on its operands widened to float64 (float32 where float64 has no kernel):
    its floating outputs and the widened operands; None when it cannot run."""
    if "out" in kwargs:
        return None
    for dt in (torch.float64, torch.float32):
        try:
            a, kw = _widen((args, kwargs), dt)
            return _floats(func(*a, **kw)), a, kw
        except Exception:  # noqa: BLE001 - no kernel for this dtype, or an operand it cannot read
            continue
    return None


def _v(x: Any) -> float:
    return float(x)


def _pointwise(name: str, vals: list[float], result: float) -> Mechanism | None:
    """A pointwise op's element: ``vals`` its operands there (tensors and scalars, in order)."""
    fin = [math.isfinite(v) for v in vals]
    if name in MUL and len(vals) >= 2:
        a, b = vals[0], vals[1]
        if (a == 0 and math.isinf(b)) or (b == 0 and math.isinf(a)):
            return M.ZERO_TIMES_INF
    if name in ADD and len(vals) >= 2:
        a, b = vals[0], vals[1]
        alpha = vals[2] if len(vals) > 2 else 1.0
        bb = b * alpha if math.isfinite(alpha) and alpha != 0 else b
        if name.startswith("sub") or name == "subtract":
            bb = -bb
        if name == "rsub":
            a, bb = -a, b * alpha
        if math.isinf(a) and math.isinf(bb) and (a > 0) != (bb > 0):
            return M.INF_MINUS_INF
    if name in DIV and len(vals) >= 2:
        a, b = vals[0], vals[1]
        if math.isinf(a) and math.isinf(b):
            return M.INF_DIV_INF
        if b == 0:
            return M.ZERO_DIV_0 if a == 0 else M.X_DIV_0 if not math.isnan(a) else M.NONFINITE_OPERAND
    if name in {"addcdiv", "addcdiv_"} and len(vals) >= 3:
        a, b = vals[1], vals[2]
        if b == 0:
            return M.ZERO_DIV_0 if a == 0 else M.X_DIV_0
        if math.isinf(a) and math.isinf(b):
            return M.INF_DIV_INF
    if name in {"addcmul", "addcmul_"} and len(vals) >= 3:
        a, b = vals[1], vals[2]
        if (a == 0 and math.isinf(b)) or (b == 0 and math.isinf(a)):
            return M.ZERO_TIMES_INF
    if name in RECIP and vals:
        if vals[0] == 0:
            return M.X_DIV_0
        if name.startswith("rsqrt") and vals[0] < 0:
            return M.DOMAIN
    if name in LOGS and vals:
        x = vals[0] + (1.0 if name.startswith("log1p") else 0.0)
        if x == 0:
            return M.LOG_0
        if x < 0:
            return M.DOMAIN
    if name in {"xlogy", "xlogy_"} and len(vals) >= 2:
        if vals[1] == 0 and vals[0] != 0:
            return M.LOG_0
        if vals[1] < 0:
            return M.DOMAIN
    if name in ROOTS and vals and vals[0] < 0:
        return M.DOMAIN
    if name in POW and len(vals) >= 2:
        base, ex = vals[0], vals[1]
        if base == 0 and ex < 0:
            return M.X_DIV_0
        if base < 0 and math.isfinite(ex) and ex != int(ex):
            return M.DOMAIN
        if all(fin) and math.isinf(result):
            return M.OVERFLOW
    if name in ARC and vals:
        x = vals[0]
        if name.startswith("atanh") and abs(x) == 1:
            return M.X_DIV_0
        if (name.startswith(("acos", "asin", "atanh", "erfinv")) and abs(x) > 1) or (
            name == "acosh" and x < 1
        ):
            return M.DOMAIN
    if name in EXPS and all(fin) and math.isinf(result):
        return M.OVERFLOW
    if not all(fin):
        return M.NONFINITE_OPERAND
    if math.isinf(result):
        return M.OVERFLOW  # finite operands, an infinite float64 result: past even float64's range
    return None


def _sum_terms(terms: torch.Tensor) -> Mechanism | None:
    """The terms summed into one element (a dot product's products, a reduced row)."""
    t = terms.reshape(-1)
    if bool(torch.isnan(t).any()):
        return None
    if bool((t == math.inf).any()) and bool((t == -math.inf).any()):
        return M.INF_MINUS_INF
    return None


def _matmul(name: str, a: tuple, idx: int, shape: list[int]) -> Mechanism | None:
    """The element ``idx`` of a matmul's output: its products, then their sum."""
    ts = [x for x in a if isinstance(x, torch.Tensor)]
    bias: torch.Tensor | None
    if name in {"addmm", "baddbmm", "addmv", "addbmm"}:
        bias, x, w = ts[0], ts[1], ts[2]
    elif name == "linear":
        x, w = ts[0], ts[1].t() if ts[1].dim() == 2 else ts[1]
        bias = ts[2] if len(ts) > 2 else None
    else:
        bias, x, w = None, ts[0], ts[1]
    if name == "dot":
        row, col = x, w
    elif name in {"mv", "addmv"}:
        row, col = x[idx], w
    else:
        coord = list(torch.unravel_index(torch.tensor(idx), tuple(shape)))
        i, j = int(coord[-2]), int(coord[-1])
        xb = x.reshape(-1, x.shape[-2], x.shape[-1]) if x.dim() > 2 else x.reshape(1, *x.shape)
        wb = w.reshape(-1, w.shape[-2], w.shape[-1]) if w.dim() > 2 else w.reshape(1, *w.shape)
        batch = idx // (shape[-1] * shape[-2])
        row = xb[batch % xb.shape[0], i]
        col = wb[batch % wb.shape[0], :, j]
    if not bool(torch.isfinite(row).all() and torch.isfinite(col).all()):
        zero_inf = ((row == 0) & torch.isinf(col)) | ((col == 0) & torch.isinf(row))
        if bool(zero_inf.any()):
            return M.ZERO_TIMES_INF
    prods = row * col
    m = _sum_terms(prods)
    if m is not None:
        return m
    if bias is not None:
        bv = bias.reshape(-1)[idx % bias.numel()] if bias.numel() else torch.tensor(0.0)
        s = prods.sum()
        if math.isinf(float(s)) and math.isinf(float(bv)) and (float(s) > 0) != (float(bv) > 0):
            return M.INF_MINUS_INF
    if not bool(torch.isfinite(prods).all()) or (bias is not None and not bool(torch.isfinite(bias).all())):
        return M.NONFINITE_OPERAND
    return M.OVERFLOW if not math.isfinite(float(prods.sum())) else None


def _dims(x: torch.Tensor, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    ds = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    return sorted(d % max(x.dim(), 1) for d in ds)


def _row(x: torch.Tensor, red: list[int], idx: int) -> torch.Tensor:
    """The slice of ``x`` reduced into output element ``idx`` (reduced dims ``red``)."""
    kept = [d for d in range(x.dim()) if d not in red]
    p = x.permute(*kept, *red)
    n_red = 1
    for d in red:
        n_red *= x.shape[d]
    return p.reshape(-1, n_red)[idx] if p.numel() else p.reshape(-1)


def _reduction(name: str, a: tuple, kw: dict, idx: int) -> Mechanism | None:
    x = a[0]
    dim = kw.get(
        "dim",
        a[1] if len(a) > 1 and not isinstance(a[1], bool) and not isinstance(a[1], torch.dtype) else None,
    )
    red = _dims(x, dim)
    n = 1
    for d in red:
        n *= x.shape[d] if x.dim() else 1
    if name in MEANS and n == 0:
        return M.EMPTY_REDUCTION
    if name in VARS:
        corr = kw.get("correction")
        if corr is None:
            unbiased = kw.get("unbiased", a[2] if len(a) > 2 and isinstance(a[2], bool) else True)
            corr = 1 if unbiased else 0
        if n - float(corr) <= 0:
            return M.EMPTY_REDUCTION
    row = _row(x, red, idx) if x.dim() else x.reshape(-1)
    if not bool(torch.isfinite(row).all()):
        return _sum_terms(row) or M.NONFINITE_OPERAND
    return M.OVERFLOW


def _softmax(name: str, a: tuple, idx: int, shape: list[int]) -> Mechanism | None:
    x = a[0]
    dim = a[1] if len(a) > 1 else -1
    red = _dims(x, dim)
    if name == "logsumexp":
        row = _row(x, red, idx)
    else:
        coord = [int(c) for c in torch.unravel_index(torch.tensor(idx), tuple(shape))]
        sl = [slice(c, c + 1) for c in coord]
        for d in red:
            sl[d] = slice(None)
        row = x[tuple(sl)].reshape(-1)
    if row.numel() and bool((row == -math.inf).all()):
        return M.ALL_MASKED_ROW
    if bool((row == math.inf).any()):
        return M.INF_MINUS_INF  # exp(x − max) with max = +inf: inf − inf
    if not bool(torch.isfinite(row).all()):
        return M.NONFINITE_OPERAND
    return M.OVERFLOW


def _normalised(
    vals: torch.Tensor, xv: float, mean: float, var: float, eps: float, affine: list[float]
) -> Mechanism | None:
    """One element of (x − mean) · rsqrt(var + eps) · w + b, from the values it was normalised over
    (``vals``; empty when the statistics are given) and its own: a non-finite operand, a negative
    var + eps under the root (``domain``: a corrupted running variance), a zero one — rsqrt(0) = ∞
    times x − mean: 0 (a group of one element, a constant one: ``0*inf``) or not (``x/0``)."""
    if not (
        bool(torch.isfinite(vals).all())
        and math.isfinite(xv)
        and math.isfinite(mean)
        and math.isfinite(var)
        and all(math.isfinite(v) for v in affine)
    ):
        return M.NONFINITE_OPERAND
    d = var + eps
    if d < 0:
        return M.DOMAIN
    if d == 0:
        return M.ZERO_TIMES_INF if xv - mean == 0 else M.X_DIV_0
    return M.OVERFLOW


def _affine(a: tuple, c: int) -> list[float]:
    """The element's weight and bias (a[1], a[2]) where given."""
    return [float(t.reshape(-1)[c]) for t in a[1:3] if isinstance(t, torch.Tensor) and t.numel()]


def _batch_norm(name: str, a: tuple, kw: dict, idx: int) -> Mechanism | None:
    """native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    (``_no_training``: without ``training``): per channel, the batch's statistics in training
    (the biased variance over N and the spatial dims), the running ones in eval."""
    x = a[0]
    training = bool(a[5]) if name != "_native_batch_norm_legit_no_training" and len(a) > 5 else False
    eps = (
        float(a[-1])
        if isinstance(a[-1], (int, float)) and not isinstance(a[-1], bool)
        else float(kw.get("eps", 0))
    )
    chans = x.shape[1] if x.dim() > 1 else 1
    inner = x[0, 0].numel() if x.dim() > 1 else 1
    c = (idx // max(inner, 1)) % chans
    xv = float(x.reshape(-1)[idx])
    if training or not isinstance(a[4], torch.Tensor):
        vals = x.movedim(1, 0)[c].reshape(-1) if x.dim() > 1 else x.reshape(-1)
        if not vals.numel():
            return M.EMPTY_REDUCTION
        mean = float(vals.mean())
        var = float(((vals - mean) ** 2).mean())
    else:
        vals = x.new_empty(0)
        mean, var = float(a[3].reshape(-1)[c]), float(a[4].reshape(-1)[c])
    return _normalised(vals, xv, mean, var, eps, _affine(a, c))


def _group_norm(a: tuple, idx: int) -> Mechanism | None:
    """native_group_norm(input, weight, bias, N, C, HxW, group, eps): the biased variance over each
    group of C/group channels × HxW (a group of one element: var 0, x − mean 0)."""
    x, n_, chans, hxw, group, eps = a[0], int(a[3]), int(a[4]), int(a[5]), int(a[6]), float(a[7])
    n, c = idx // max(chans * hxw, 1), (idx // max(hxw, 1)) % max(chans, 1)
    g = c // max(chans // max(group, 1), 1)
    vals = x.reshape(n_, group, -1)[n, g]
    if not vals.numel():
        return M.EMPTY_REDUCTION
    mean = float(vals.mean())
    var = float(((vals - mean) ** 2).mean())
    return _normalised(vals, float(x.reshape(-1)[idx]), mean, var, eps, _affine(a, c))


def _norm(name: str, a: tuple, kw: dict, idx: int, shape: list[int]) -> Mechanism | None:
    x = a[0]
    nshape = a[1] if len(a) > 1 and isinstance(a[1], (list, tuple)) else [x.shape[-1]]
    k = len(nshape)
    red = list(range(x.dim() - k, x.dim()))
    n = 1
    for d in red:
        n *= x.shape[d]
    rows = x.reshape(-1, n) if n else x.reshape(-1, 1)
    row = rows[(idx // max(n, 1)) % rows.shape[0]]
    if not bool(torch.isfinite(row).all()):
        if bool(torch.isnan(row).any()):
            return M.NONFINITE_OPERAND
        return M.INF_MINUS_INF if name in {"native_layer_norm", "layer_norm"} else M.ZERO_TIMES_INF
    eps = a[-1] if isinstance(a[-1], float) else kw.get("eps")
    if bool((row == 0).all()) and not eps:
        return M.ZERO_TIMES_INF  # (x − mean) = 0 times rsqrt(var + 0) = inf
    for t in a[2:4]:
        if isinstance(t, torch.Tensor) and not bool(torch.isfinite(t).all()):
            return M.NONFINITE_OPERAND
    return M.OVERFLOW


def _nll(a: tuple, kw: dict) -> Mechanism | None:
    x, target = a[0], a[1]
    weight = a[2] if len(a) > 2 and isinstance(a[2], torch.Tensor) else kw.get("weight")
    reduction = a[3] if len(a) > 3 else kw.get("reduction", 1)
    ignore = a[4] if len(a) > 4 else kw.get("ignore_index", -100)
    if reduction == 1:  # mean: sum of the kept terms over the sum of their weights
        keep = target != ignore
        w = (
            weight[target.clamp_min(0)]
            if weight is not None
            else torch.ones_like(target, dtype=torch.float64)
        )
        if float((w * keep).sum()) == 0:
            return M.EMPTY_REDUCTION
    if not bool(torch.isfinite(x).all()):
        return M.NONFINITE_OPERAND
    return M.OVERFLOW


def _element(t: torch.Tensor, shape: list[int], idx: int) -> float:
    """A tensor operand's value at output element ``idx`` (broadcast to the output's shape)."""
    try:
        return float(t.broadcast_to(shape).reshape(-1)[idx])
    except RuntimeError:
        return float(t.reshape(-1)[idx % max(t.numel(), 1)])


def mechanism_of(
    func: Any, args: tuple, kwargs: dict, out: Any, prefer: str | None = None
) -> Mechanism | None:
    """The mechanism of the first ``prefer`` element of ``func``'s output (see the module
    docstring). ``args``/``kwargs``: the operands as the op saw them."""
    outs = _floats(out)
    which = next((i for i, t in enumerate(outs) if t.numel() and not bool(torch.isfinite(t).all())), None)
    if which is None:
        return None
    try:
        o = plain(outs[which])
    except Unreadable:
        return None
    idx = _first(o, prefer)
    if idx is None:
        return None
    wide = rerun_wide(func, args, kwargs)
    if wide is None:
        return None
    w_outs, a, kw = wide
    if which >= len(w_outs) or w_outs[which].shape != o.shape:
        return None
    v64 = float(w_outs[which].reshape(-1)[idx])
    name = _name(func)
    if math.isfinite(v64):
        return M.OVERFLOW  # the float64 value is finite: the op's own dtype could not hold it
    shape = list(o.shape)
    try:
        if name in MATMUL:
            return _matmul(name, a, idx, shape)
        if name in SOFTMAX:
            return _softmax(name, a, idx, shape)
        if name in NORMS:
            return _norm(name, a, kw, idx, shape)
        if name in BATCH_NORMS and which == 0:  # (not a saved statistic: an element of the output)
            return _batch_norm(name, a, kw, idx)
        if name in GROUP_NORMS and which == 0:
            return _group_norm(a, idx)
        if name in NLL:
            return _nll(a, kw)
        if name in MEANS | VARS | SUMS:
            return _reduction(name, a, kw, idx)
        if (
            torch.Tag.pointwise in getattr(func, "tags", ())
            or name in MUL | ADD | DIV | RECIP | LOGS | ROOTS | POW
        ):
            flat, _ = tree_flatten((a, kw))
            vals = [
                _element(x, shape, idx) if isinstance(x, torch.Tensor) else _v(x)
                for x in flat
                if (isinstance(x, torch.Tensor) and x.is_floating_point())
                or (isinstance(x, (int, float)) and not isinstance(x, bool))
            ]
            return _pointwise(name, vals, v64)
    except (RuntimeError, IndexError, ValueError, TypeError):
        return None
    flat, _ = tree_flatten((a, kw))
    if any(
        isinstance(x, torch.Tensor) and x.is_floating_point() and not bool(torch.isfinite(x).all())
        for x in flat
    ):
        return M.NONFINITE_OPERAND
    return None
