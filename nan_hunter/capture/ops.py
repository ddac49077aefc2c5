"""Op-level view: a TorchDispatchMode that checks every aten op's outputs.

Used two ways: ``first_bad_op`` re-runs one module from its captured inputs and names the first
op whose output is non-finite (the first non-finite value, not the first NaN), with the user's
source line and the operands' statistics; ``OpWatch`` (level "ops") watches a whole forward to
see intermediates that went non-finite and were absorbed before any module output (RMSNorm's
``x.pow(2).mean()`` = inf → rsqrt → 0), and −inf masks absorbed by softmax/where/masked_fill.

In-place and ``out=`` ops are judged on their operands as they were before the op (a copy of
each written operand is taken first). An op that overflowed gets its true magnitude from the
same op re-run on its operands in float64 (``OpEvent.exact_absmax``). Tensor subclasses
(torchao's ``Float8Tensor``) are read through ``kernels.reference.plain``; an operand that cannot
be read is left out, never raised on.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import sysconfig
import traceback
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ..kernels.compare import compare
from ..kernels.reference import Unreadable, plain
from ..model.copy_run import run_copy
from ..tree import float_tensors
from .mechanism import mechanism_of

# Directories with a trailing separator, so that ``torchao/`` or ``torchvision/`` never count as
# inside torch, nor a user's ``nan_hunter_tests/`` as inside nanhunter.
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


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
    param: str | None = None  # the model's parameter or buffer this operand is (or a view of), dotted name

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
    exact_absmax: float | None = None  # |result| of the op re-run on its operands in float64
    exact_dtype: str | None = None  # the dtype that re-run used (fp64, or fp32 where fp64 has no kernel)
    outcome: str | None = None  # level "ops", absorbed values: how the module output compares with float64
    rel_err: float | None = None  # that module output's relative error against float64
    grad_fn: str | None = None  # in a backward pass: the autograd node running the op (``SqrtBackward0``)
    call: Any = field(
        default=None, repr=False, compare=False
    )  # level "ops": the module call running it, until judged
    mechanism: str | None = (
        None  # contract v1.4: how IEEE arithmetic made the first new element (capture.mechanism)
    )


def operand_stats(i: int, x: Any) -> OperandStats | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        v = float(x)
        finite = math.isfinite(v)
        return OperandStats(
            i,
            "scalar",
            [],
            finite,
            int(math.isnan(v)),
            int(v == math.inf),
            int(v == -math.inf),
            abs(v) if finite else None,
            v,
            v,
            abs(v) if v and finite else None,
            int(v == 0),
            int(v < 0),
            1,
            scalar=v,
        )
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.is_meta:
        return None
    dtype = str(x.dtype).removeprefix("torch.")
    try:
        x = plain(x)
    except Unreadable:
        return None
    n = x.numel()
    if n == 0:
        return OperandStats(i, dtype, list(x.shape), True, 0, 0, 0, None, None, None, None, 0, 0, 0)
    f = x.float().reshape(-1)
    isn = torch.isnan(f)
    isi = torch.isinf(f)
    fin = ~(isn | isi)
    ff = f[fin]
    a = ff.abs()
    nz = a[a > 0]
    return OperandStats(
        i,
        dtype,
        list(x.shape),
        bool(fin.all()),
        int(isn.sum()),
        int((isi & (f > 0)).sum()),
        int((isi & (f < 0)).sum()),
        float(a.max()) if a.numel() else None,
        float(ff.min()) if ff.numel() else None,
        float(ff.max()) if ff.numel() else None,
        float(nz.min()) if nz.numel() else None,
        int((ff == 0).sum()),
        int((ff < 0).sum()),
        n,
        None if n != 1 else float(f[0]),
    )


def _counts(outs: list[torch.Tensor]) -> tuple[int, int, int]:
    nan = pos = neg = 0
    for t in outs:
        try:
            f = plain(t)
        except Unreadable:
            continue
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


def _frames_inside() -> list[traceback.FrameSummary]:
    """Frames of the running re-run, innermost first: those between nanhunter's own dispatch
    frames (innermost) and nanhunter's caller frames (the boundary)."""
    inside: list[traceback.FrameSummary] = []
    for fr in reversed(traceback.extract_stack()[:-2]):
        fn = os.path.abspath(fr.filename)
        if fn.startswith(_PKG_DIR):
            if inside:
                break  # reached nanhunter's caller frames: the boundary
            continue  # nanhunter's own dispatch frames, innermost
        inside.append(fr)
    return inside


#: installed packages whose frames wrap a model's code without being it (accelerate's offload hooks)
_WRAPPERS = tuple(f"-packages{os.sep}{name}{os.sep}" for name in ("accelerate",))


def is_model_code(filename: str) -> bool:
    """The model's own code: not torch's package (directory with its separator, so ``torchao/``
    and ``torchvision/`` are model code), not the standard library, not accelerate's hooks."""
    fn = os.path.abspath(filename)
    if fn.startswith(_TORCH_DIR) or any(w in fn for w in _WRAPPERS):
        return False
    return not fn.startswith(_STDLIB_DIR) or "-packages" + os.sep in fn


class ModelSites:
    """The model's own source line of the running code, fast enough to ask per module call and per
    op: the innermost frame in model code (``is_model_code``; nanhunter's own frames never are),
    with each file's verdict cached (a dict lookup per frame). What a ``Recorder``'s observers
    name their entries' ``source`` by (``Recorder.source_site``)."""

    MAX_FRAMES = 64

    def __init__(self) -> None:
        self._model: dict[str, bool] = {}

    def _is_model(self, fn: str) -> bool:
        k = self._model.get(fn)
        if k is None:
            # <frozen runpy>, <string>: not the model's source; nanhunter's own code: a library here
            k = self._model[fn] = (
                not fn.startswith("<") and not os.path.abspath(fn).startswith(_PKG_DIR) and is_model_code(fn)
            )
        return k

    def site(self, skip: int = 1) -> tuple[str, int] | None:
        """(file, line) of the innermost model-code frame above the caller's ``skip`` frames."""
        f: FrameType | None = sys._getframe(skip + 1)
        for _ in range(self.MAX_FRAMES):
            if f is None:
                break
            if self._is_model(f.f_code.co_filename):
                return f.f_code.co_filename, f.f_lineno
            f = f.f_back
        return None


def _where(frame: traceback.FrameSummary) -> str:
    code = (frame.line or "").strip()
    return f"{frame.filename}:{frame.lineno}" + (f"  {code}" if code else "")


def call_site() -> str | None:
    """The innermost frame in the model's own code of the running re-run (``file.py:line  code``),
    or None when there is none (a torch module re-run on its own)."""
    frame = next((f for f in _frames_inside() if is_model_code(f.filename)), None)
    return _where(frame) if frame is not None else None


def user_source(fallback: str | None = None) -> str | None:
    """``file.py:line  code`` where the op was called: the innermost frame in the model's own code
    (``call_site``); else ``fallback`` (where the re-run module was called from, in the model's
    code); else the torch module's own frame (``nn/modules/linear.py``)."""
    inside = _frames_inside()
    frame = next((f for f in inside if is_model_code(f.filename)), None)
    if frame is not None:
        return _where(frame)
    if fallback is not None:
        return fallback
    frame = next(
        (f for f in inside if "/nn/modules/" in f.filename and not f.filename.endswith("module.py")),
        inside[0] if inside else None,
    )
    return _where(frame) if frame is not None else None


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in [^\n]*\n(?P<code>[^\n]*)')


def forward_source(node: Any) -> str | None:
    """``file.py:line  code`` in the model's own code where the forward created autograd node
    ``node`` (recorded when the forward ran under anomaly mode), innermost frame first."""
    try:
        tb = node.metadata.get("traceback_")
    except (AttributeError, RuntimeError):
        return None
    if not tb:
        return None
    frames = [m for m in _FRAME.finditer("".join(tb))]
    for m in reversed(frames):
        fn = os.path.abspath(m["file"])
        if fn.startswith(_PKG_DIR) or not is_model_code(fn):
            continue
        code = m["code"].strip()
        return f"{m['file']}:{m['line']}" + (f"  {code}" if code else "")
    return None


def _float_tensors(obj: Any) -> list[torch.Tensor]:
    return [t for _, t in float_tensors(obj)]


def _kind(nan: int, pos: int, neg: int) -> str | None:
    return "nan" if nan else "posinf" if pos else "neginf" if neg else None


#: ops that only move or reinterpret data: they never *produce* a non-finite value
VIEW_OPS = {
    "t",
    "view",
    "_unsafe_view",
    "permute",
    "expand",
    "clone",
    "contiguous",
    "detach",
    "transpose",
    "reshape",
    "_to_copy",
    "alias",
    "unsqueeze",
    "squeeze",
    "slice",
    "select",
    "as_strided",
    "copy_",
    "split",
    "split_with_sizes",
    "unbind",
    "cat",
    "stack",
    "index_select",
    "embedding",
    "lift_fresh",
}


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


def _written(func: Any) -> tuple[set[int], set[str], set[str]]:
    """What ``func`` writes to: positions and names of written operands (``self`` of ``add_``),
    and names of keyword-only output buffers (``out``)."""
    pos: set[int] = set()
    names: set[str] = set()
    outs: set[str] = set()
    try:
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                if a.kwarg_only:
                    outs.add(a.name)
                else:
                    pos.add(i)
                    names.add(a.name)
    except AttributeError:  # not an OpOverload
        pass
    return pos, names, outs


def before_op(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """The operands as the op will see them, for an op that writes into some: in-place operands
    copied (their values before the op), ``out=`` buffers left out (their old contents are no
    operand). None for an op that writes nothing."""
    pos, names, outs = _written(func)
    if not pos and not outs:
        return None

    def keep(x: Any) -> Any:
        if (
            isinstance(x, torch.Tensor)
            and x.is_floating_point()
            and type(x) in (torch.Tensor, torch.nn.Parameter)
        ):
            return x.detach().clone()
        return x

    a = tuple(keep(x) if i in pos else x for i, x in enumerate(args))
    kw = {k: keep(v) if k in names else v for k, v in kwargs.items() if k not in outs}
    return a, kw


def exact_absmax(func: Any, args: tuple, kwargs: dict) -> tuple[float | None, str | None]:
    """|result| of ``func`` re-run on its operands widened to float64 (float32 where float64 has
    no kernel): the magnitude an overflowed result really had. (None, None) when it cannot run."""
    if "out" in kwargs:
        return None, None
    for dt, name in ((torch.float64, "fp64"), (torch.float32, "fp32")):

        def widen(x: Any, dt: torch.dtype = dt) -> Any:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                return plain(x).to(dt)
            return x

        try:
            a, kw = tree_map(widen, (args, kwargs))
            kw = {
                k: (dt if k == "dtype" and isinstance(v, torch.dtype) and v.is_floating_point else v)
                for k, v in kw.items()
            }
            outs = _float_tensors(func(*a, **kw))
        except Exception:  # noqa: BLE001 - no kernel for this dtype, or a subclass operand
            continue
        vals = [o.abs().max() for o in outs if o.numel()]
        if not vals:
            return None, None
        m = float(torch.stack([v.to(torch.float64) for v in vals]).max())
        return (m, name) if math.isfinite(m) else (None, None)
    return None, None


def _storage(x: Any) -> int | None:
    """Where a tensor's memory starts (views of a parameter share it); None when it has none."""
    if not isinstance(x, torch.Tensor) or x.is_meta:
        return None
    try:
        ptr = x.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a subclass without storage (DTensor, Float8Tensor)
        return None
    return ptr or None


def parameter_storages(module: torch.nn.Module, prefix: str = "") -> dict[int, str]:
    """The storage of each parameter and buffer of ``module`` → its dotted name (``prefix`` + the
    name in ``named_parameters()``): operands that are one of them, or a view of one (``weight.t()``),
    are named by it."""
    out: dict[int, str] = {}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        ptr = _storage(t)
        if ptr is not None:
            out.setdefault(ptr, prefix + name)
    return out


def new_nonfinite(
    func: Any,
    args: tuple,
    kwargs: dict,
    out: Any,
    site: str | None = None,
    params: dict[int, str] | None = None,
    mechanism: bool = True,
) -> OpEvent | None:
    """An event when ``func`` introduced a non-finite class (NaN, +inf or -inf) that none of its
    operands held: the op that *made* the value, as opposed to ops that carried it along (and to
    -inf masks written in on purpose, whose operand already is -inf). ``args``/``kwargs`` are the
    operands as the op saw them (``before_op`` for in-place ops); ``params`` (``parameter_storages``)
    names the operands that are parameters; ``mechanism``: classify the first new element
    (``capture.mechanism``; level "ops" records absorbed values and leaves it out)."""
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
    for o in operands if params else ():
        ptr = _storage(flat[o.index])
        o.param = params.get(ptr) if params and ptr is not None else None
    ev = OpEvent(
        str(func),
        _kind(nan, pos, neg),
        nan,
        pos,
        neg,
        user_source(site),
        operands,
        str(outs[0].dtype).removeprefix("torch."),
    )
    node = torch._C._current_autograd_node()
    if node is not None:  # a backward op: name its node, and the forward line that created it
        ev.grad_fn = node.name()
        ev.source = forward_source(node) or ev.source
    if (pos or neg) and not nan and not (in_nan or in_pos or in_neg):
        ev.exact_absmax, ev.exact_dtype = exact_absmax(func, args, kwargs)
    prefer = "nan" if nan and not in_nan else "posinf" if pos and not in_pos else "neginf"
    if not mechanism:
        return ev
    try:
        m = mechanism_of(func, args, kwargs, out, prefer)
    except Exception:  # noqa: BLE001 - an op the classifier cannot evaluate: mechanism stays null, a note says so
        m = None
    ev.mechanism = m.value if m is not None else None
    return ev


#: ops whose −inf comes from a zero (log 0), the way log-space masks are written
_LOG_OPS = {"log", "log2", "log10", "log1p", "xlogy", "special_xlog1py", "logit"}


def _sentinel(o: OperandStats, out_dtype: str | None) -> bool:
    """An operand at a mask sentinel: a tensor within a factor 2 of its own dtype's max
    (``finfo.min`` planes), or a Python scalar beyond half the output dtype's max (``* -1e9``)."""
    if o.absmax is None:
        return False
    name = out_dtype if o.dtype == "scalar" else o.dtype
    dt = getattr(torch, name or "", None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        return False
    return o.absmax >= 0.5 * torch.finfo(dt).max


def overflowed_to_neginf(ev: OpEvent) -> bool:
    """−inf made from finite, ordinary operands (none at a mask sentinel, not a log of zero): an
    overflow, such as a weight at −1e6 cast to fp16 by autocast — a fault, not how a mask is
    written (``masked_fill(-inf)``, ``finfo.min + finfo.min``, ``mask * -1e9``)."""
    if not ev.neginf or ev.nan or ev.posinf:
        return False
    if ev.op.split(".")[1 if ev.op.startswith("aten.") else 0] in _LOG_OPS:
        return False
    return all(o.finite for o in ev.operands) and not any(_sentinel(o, ev.out_dtype) for o in ev.operands)


#: the factories whose result is memory nobody wrote: what they hold is no op's result (under
#: ``torch.use_deterministic_algorithms(True)`` torch fills them with NaN); a read of it is judged by
#: ``capture.fresh_fill``
ALLOCATIONS = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}


class FirstBadOp(TorchDispatchMode):
    """Finds the op that made the first non-finite value of a module call.

    ``first``: the first op that introduced NaN or +inf (a class none of its operands held), or
    −inf out of ordinary finite operands (``overflowed_to_neginf``). Other −inf alone is how masks
    are written (``masked_fill(-inf)``, ``finfo.min + finfo.min``), so an op that only introduced
    such a −inf is kept aside (``first_neginf``) and reported only when nothing later made a
    NaN/+inf. ``first_carrier``: for values that came in non-finite (bad weights or
    data), the first computing op whose output is non-finite. ``site``: where the re-run module
    was called from in the model's code, the source line when the op has none of its own.
    ``params``: ``parameter_storages`` of the module, naming operands that are its parameters."""

    def __init__(self, site: str | None = None, params: dict[int, str] | None = None) -> None:
        super().__init__()
        self.params = params
        self.first: OpEvent | None = None
        self.first_neginf: OpEvent | None = None
        self.first_carrier: OpEvent | None = None
        self.n_ops = 0
        self.site = site

    @property
    def result(self) -> OpEvent | None:
        return self.first or self.first_neginf or self.first_carrier

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        seen = before_op(func, args, kwargs) if self.first is None else None
        out = func(*args, **kwargs)
        self.n_ops += 1
        if self.first is not None or func._opname in ALLOCATIONS:
            return out
        a, kw = seen if seen is not None else (args, kwargs)
        ev = new_nonfinite(func, a, kw, out, self.site, self.params)
        if ev is not None:
            if ev.nan or ev.posinf or overflowed_to_neginf(ev):
                self.first = ev
            elif self.first_neginf is None:
                self.first_neginf = ev
        elif self.first_carrier is None and func._opname not in VIEW_OPS:
            outs = _float_tensors(out)
            if outs:
                nan, pos, neg = _counts(outs)
                if nan or pos or neg:
                    flat, _ = tree_flatten((a, kw))
                    operands = [s for s in (operand_stats(i, x) for i, x in enumerate(flat)) if s is not None]
                    self.first_carrier = OpEvent(
                        str(func),
                        _kind(nan, pos, neg),
                        nan,
                        pos,
                        neg,
                        user_source(self.site),
                        operands,
                        str(outs[0].dtype).removeprefix("torch."),
                    )
        return out


def first_bad_op(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    grad: bool | None = False,
    site: str | None = None,
    prefix: str = "",
) -> tuple[OpEvent | None, Any]:
    """Re-run ``module(*args, **kwargs)`` under FirstBadOp; returns (first event, output).
    ``grad``: the grad mode to run in (None: as the caller has it, e.g. a watched forward's: it
    decides paths such as nn.MultiheadAttention's fused fast path). ``site``: see FirstBadOp.
    Operands that are the module's parameters are named ``prefix`` + their name."""
    mode = FirstBadOp(site, parameter_storages(module, prefix))
    grad_ctx = torch.set_grad_enabled(grad) if grad is not None else contextlib.nullcontext()
    with grad_ctx, mode:
        out = module(*args, **kwargs)
    return mode.result, out


#: relative error against float64 under which a module output that absorbed a non-finite
#: intermediate is called right (in units of its dtype's eps; float32 is compared at 1e-5)
EXACT_EPS = 16


class OpWatch(TorchDispatchMode):
    """Level "ops": non-finite op outputs during a whole forward, tagged with the running module.
    When such a value is absorbed (the module output stays finite), the module is re-run in
    float64 from its inputs to tell a harmless intermediate (gelu_new's ``pow(x, 3)`` → inf →
    ``tanh`` → ±1, exact) from a silently wrong output (RMSNorm's variance → inf → zeros)."""

    def __init__(self, watch: Any) -> None:
        super().__init__()
        self.watch = watch
        self.records: list[OpEvent] = []
        self.limit = 256
        self.judged = 0
        self.judge_limit = 16  # float64 re-runs per watch, at most
        self.judge_max_params = 100_000_000  # larger modules are not copied to float64

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if len(self.records) >= self.limit:
            return func(*args, **kwargs)
        seen = before_op(func, args, kwargs)
        out = func(*args, **kwargs)
        a, kw = seen if seen is not None else (args, kwargs)
        ev = new_nonfinite(func, a, kw, out, mechanism=False)
        if ev is not None:
            stack = self.watch._stack
            ev.module = stack[-1].module if stack else None
            ev.call = stack[-1] if stack else None
            self.records.append(ev)
        return out

    def module_done(self, call: Any, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """After a module call: judge the absorbed values it made against a float64 re-run."""
        mine = [ev for ev in self.records if ev.call is call]
        if not mine:
            return
        for ev in mine:
            ev.call = None
        outs = _float_tensors(output)
        if not outs or any(sum(_counts([o])) for o in outs):
            return  # not absorbed: the module output itself is non-finite
        if (
            self.judged >= self.judge_limit
            or sum(p.numel() for p in module.parameters()) > self.judge_max_params
        ):
            return
        self.judged += 1
        try:
            ref_out = _float_tensors(run_copy(module, args, kwargs, torch.float64, training=None))
        except Exception:  # noqa: BLE001 - no float64 kernel, a subclass weight: leave it unjudged
            return

        err = compare([plain(o) for o in outs], ref_out).finite_rel_err
        if err is None:
            return  # the float64 run is no reference here: leave it unjudged
        eps = (
            max(torch.finfo(outs[0].dtype).eps * EXACT_EPS, 1e-5) if outs[0].dtype.is_floating_point else 1e-5
        )
        for ev in mine:
            ev.rel_err = err
            if err <= eps:
                ev.outcome = (
                    f"harmless: {ev.module or '<root>'}'s output matches float64 (relative error "
                    f"{err:.2g}), the non-finite intermediate does not change it"
                )
            else:
                ev.outcome = (
                    f"the result is finite but silently wrong: {ev.module or '<root>'}'s output is off "
                    f"from float64 by a relative error of {err:.2g}"
                )
