"""Op-level view: a TorchDispatchMode that checks every aten op's outputs.

Used two ways: ``first_bad_op`` re-runs one module from its captured inputs and names the first
op whose output is non-finite (the first non-finite value, not the first NaN), with the user's
source line and the operands' statistics; ``OpWatch`` (level "ops") watches a whole forward to
see intermediates that went non-finite and were absorbed before any module output (RMSNorm's
``x.pow(2).mean()`` = inf → rsqrt → 0), and −inf masks absorbed by softmax/where/masked_fill.
"""

from __future__ import annotations

import math
import os
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..tree import float_tensors

# Directories with a trailing separator, so that ``torchao/`` or ``torchvision/`` never count as
# inside torch, nor a user's ``nan_hunter_tests/`` as inside nanhunter.
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


@dataclass
class OperandStats:
    """What the diagnosis rules need to know about an operand."""

    index: int
    dtype: str
    shape: list[int]
    finite: bool
    nan: int
    posinf: int
    neginf: int
    absmax: float | None
    min: float | None
    max: float | None
    min_nonzero: float | None
    zeros: int
    negatives: int
    numel: int
    scalar: float | None = None  # for Python scalar operands

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class OpEvent:
    op: str
    kind: str | None  # nan | posinf | neginf (first present, by severity) for the outputs
    nan: int
    posinf: int
    neginf: int
    source: str | None
    operands: list[OperandStats] = field(default_factory=list)
    out_dtype: str | None = None
    module: str | None = None


def operand_stats(i: int, x: Any) -> OperandStats | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        v = float(x)
        fin = math.isfinite(v)
        return OperandStats(i, "scalar", [], fin, int(math.isnan(v)), int(v == math.inf), int(v == -math.inf),
                            abs(v) if fin else None, v, v, abs(v) if v and fin else None, int(v == 0),
                            int(v < 0), 1, scalar=v)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.is_meta:
        return None
    n = x.numel()
    if n == 0:
        return OperandStats(i, str(x.dtype).removeprefix("torch."), list(x.shape), True, 0, 0, 0, None, None,
                            None, None, 0, 0, 0)
    f = x.detach().float().reshape(-1)
    isn = torch.isnan(f)
    isi = torch.isinf(f)
    fin = ~(isn | isi)
    ff = f[fin]
    a = ff.abs()
    nz = a[a > 0]
    return OperandStats(
        i, str(x.dtype).removeprefix("torch."), list(x.shape), bool(fin.all()), int(isn.sum()),
        int((isi & (f > 0)).sum()), int((isi & (f < 0)).sum()),
        float(a.max()) if a.numel() else None, float(ff.min()) if ff.numel() else None,
        float(ff.max()) if ff.numel() else None, float(nz.min()) if nz.numel() else None,
        int((ff == 0).sum()), int((ff < 0).sum()), n, None if n != 1 else float(f[0]),
    )


def _counts(outs: list[torch.Tensor]) -> tuple[int, int, int]:
    nan = pos = neg = 0
    for t in outs:
        f = t.detach()
        if f.numel() == 0:
            continue
        if f.dtype.itemsize == 1:
            f = f.float()
        lo, hi = torch.aminmax(f)
        if math.isfinite(float(lo)) and math.isfinite(float(hi)):
            continue
        nan += int(torch.isnan(f).sum())
        pos += int((f == math.inf).sum())
        neg += int((f == -math.inf).sum())
    return nan, pos, neg


def user_source() -> str | None:
    """``file.py:line  code`` where the op was called: the innermost frame outside torch, looking
    only at frames inside nanhunter's own re-run call (the boundary). When the op comes from a
    torch module with no user code in between (``nn.Linear``), the module's own frame is given."""
    inside: list[traceback.FrameSummary] = []
    for fr in reversed(traceback.extract_stack()[:-1]):
        fn = os.path.abspath(fr.filename)
        if fn.startswith(_PKG_DIR):
            if inside:
                break  # reached nanhunter's caller frames: the boundary
            continue  # nanhunter's own dispatch frames, innermost
        inside.append(fr)
    frame = next((f for f in inside if not os.path.abspath(f.filename).startswith(_TORCH_DIR)
                  and "/contextlib.py" not in f.filename), None)
    if frame is None:
        frame = next((f for f in inside if "/nn/modules/" in f.filename and not f.filename.endswith("module.py")),
                     inside[0] if inside else None)
    if frame is None:
        return None
    code = (frame.line or "").strip()
    return f"{frame.filename}:{frame.lineno}" + (f"  {code}" if code else "")


def _float_tensors(obj: Any) -> list[torch.Tensor]:
    return [t for _, t in float_tensors(obj)]


def _kind(nan: int, pos: int, neg: int) -> str | None:
    return "nan" if nan else "posinf" if pos else "neginf" if neg else None


#: ops that only move or reinterpret data: they never *produce* a non-finite value
VIEW_OPS = {"t", "view", "_unsafe_view", "permute", "expand", "clone", "contiguous", "detach", "transpose",
            "reshape", "_to_copy", "alias", "unsqueeze", "squeeze", "slice", "select", "as_strided", "copy_",
            "split", "split_with_sizes", "unbind", "cat", "stack", "index_select", "embedding", "lift_fresh"}


def _classes(flat: list[Any]) -> tuple[bool, bool, bool]:
    """Which non-finite classes (nan, +inf, -inf) the operands hold."""
    nan = pos = neg = False
    for x in flat:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            nan |= math.isnan(x)
            pos |= x == math.inf
            neg |= x == -math.inf
        elif isinstance(x, torch.Tensor) and x.is_floating_point() and not x.is_meta and x.numel():
            a, b, c = _counts([x])
            nan, pos, neg = nan or a > 0, pos or b > 0, neg or c > 0
    return nan, pos, neg


def new_nonfinite(func: Any, args: tuple, kwargs: dict, out: Any) -> OpEvent | None:
    """An event when ``func`` introduced a non-finite class (NaN, +inf or -inf) that none of its
    operands held: the op that *made* the value, as opposed to ops that carried it along (and to
    -inf masks written in on purpose, whose operand already is -inf)."""
    outs = _float_tensors(out)
    if not outs:
        return None
    nan, pos, neg = _counts(outs)
    if not (nan or pos or neg):
        return None
    flat, _ = tree_flatten((args, kwargs))
    in_nan, in_pos, in_neg = _classes(flat)
    if not ((nan and not in_nan) or (pos and not in_pos) or (neg and not in_neg)):
        return None
    operands = [s for s in (operand_stats(i, x) for i, x in enumerate(flat)) if s is not None]
    return OpEvent(str(func), _kind(nan, pos, neg), nan, pos, neg, user_source(), operands,
                   str(outs[0].dtype).removeprefix("torch."))


class FirstBadOp(TorchDispatchMode):
    """Finds the op that made the first non-finite value of a module call.

    ``first``: the first op that introduced NaN or +inf (a class none of its operands held).
    −inf alone is how masks are written (``masked_fill(-inf)``, ``finfo.min + finfo.min``), so an
    op that only introduced −inf is kept aside (``first_neginf``) and reported only when nothing
    later made a NaN/+inf. ``first_carrier``: for values that came in non-finite (bad weights or
    data), the first computing op whose output is non-finite."""

    def __init__(self) -> None:
        super().__init__()
        self.first: OpEvent | None = None
        self.first_neginf: OpEvent | None = None
        self.first_carrier: OpEvent | None = None
        self.n_ops = 0

    @property
    def result(self) -> OpEvent | None:
        return self.first or self.first_neginf or self.first_carrier

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.n_ops += 1
        if self.first is not None:
            return out
        ev = new_nonfinite(func, args, kwargs, out)
        if ev is not None:
            if ev.nan or ev.posinf:
                self.first = ev
            elif self.first_neginf is None:
                self.first_neginf = ev
        elif self.first_carrier is None and func._opname not in VIEW_OPS:
            outs = _float_tensors(out)
            if outs:
                nan, pos, neg = _counts(outs)
                if nan or pos or neg:
                    flat, _ = tree_flatten((args, kwargs))
                    operands = [s for s in (operand_stats(i, x) for i, x in enumerate(flat)) if s is not None]
                    self.first_carrier = OpEvent(str(func), _kind(nan, pos, neg), nan, pos, neg, user_source(),
                                                 operands, str(outs[0].dtype).removeprefix("torch."))
        return out


def first_bad_op(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[OpEvent | None, Any]:
    """Re-run ``module(*args, **kwargs)`` under FirstBadOp; returns (first event, output)."""
    mode = FirstBadOp()
    with torch.no_grad(), mode:
        out = module(*args, **kwargs)
    return mode.result, out


class OpWatch(TorchDispatchMode):
    """Level "ops": non-finite op outputs during a whole forward, tagged with the running module."""

    def __init__(self, watch: Any) -> None:
        super().__init__()
        self.watch = watch
        self.records: list[OpEvent] = []
        self.limit = 256

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if len(self.records) >= self.limit:
            return out
        ev = new_nonfinite(func, args, kwargs, out)
        if ev is not None:
            stack = self.watch._stack
            ev.module = self.watch.calls[stack[-1]].module if stack else None
            self.records.append(ev)
        return out
