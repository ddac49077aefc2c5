"""The truth tracer: where a run first turned finite values into NaN/Inf, derived without nanhunter.

``Tracer(model, optimizer=None)`` is a context manager around the user's own code (a training
loop, ``generate()``, a plain forward). It watches three things, each its own way:

- **The module stack**, by *global* module hooks (``register_module_forward_pre_hook`` /
  ``register_module_forward_hook``), with dotted names from ``model.named_modules()``. Each module
  call is a frame; a per-module pre-hook (``with_kwargs``) keeps a copy of the call's inputs for
  the oracle's own replay.
- **Every aten op**, by a ``TorchDispatchMode``: an op is an *event* when its output holds a
  non-finite class (NaN, +inf, −inf) that none of its tensor operands held. In-place and ``out=``
  ops are judged against a copy of each written operand taken before the op; views and the
  uninitialised factories (``empty``...) are skipped. Each event keeps the op, the innermost
  module, phase, step, the operands' absmax (torchao ``Float8TrainingTensor`` operands read as
  torchao defines their value, ``_data.to(_orig_dtype) / _scale``), the op re-run in float64 from
  those operands, the output's kind (nan before posinf before neginf) and, for token models, the
  batch row and token position of the first row holding the new values (for an op whose output
  has no token rows, such as autocast casting a weight, the first non-finite row of its module
  call's output). The position counts that row's own tokens: the attention mask when the call has
  one (left padding not counted), else the KV cache's length plus the token's index.
- **Phases**: ``forward``; ``backward`` when autograd is running a node
  (``torch._C._current_autograd_node()``: on the CPU the engine runs the backward on the calling
  thread, so the mode and the hooks see it); ``optimizer`` between the optimizer's step pre- and
  post-hooks. ``step`` counts calls of the root module (0-based); a backward or optimizer fault
  belongs to the root call it follows. A backward op's module is the module whose forward created
  the autograd node running it: each module's forward post-hook labels the nodes created during
  its call (sequence numbers at or after a probe node made in its pre-hook), innermost first.

**Which event is the fault (the contract's rule, followed here).** An event whose innermost
module call finishes with finite outputs was *absorbed* (RMSNorm's ``pow`` = inf → ``rsqrt`` = 0;
a −inf mask eaten by softmax, T5's ``log(0)`` bucket) and is not a fault. The forward fault is in
the module call that *finished first* with a non-finite output among those holding an event
(completion order, like the producer rule: an outer call whose own mask op came first still
finishes after the inner call that made the fault); within that call, the op named is the first
event introducing NaN or +inf, and an op that only introduced −inf is named only when nothing in
that call made NaN or +inf (a −inf written on purpose, ``masked_fill(-inf)`` on finite input,
*is* a new −inf class: it is a mask, not a fault, unless its −inf reaches the module's output and
nothing there made NaN/+inf). Backward: the first backward event introducing NaN/+inf, else the first −inf one.
Optimizer: the first parameter, in ``param_groups`` order, finite with a finite gradient before
``step()`` and non-finite after it (kind: nan if any NaN, else posinf, else neginf), with the
first optimizer event for the op and cause. ``role`` is ``input`` when the root's floating inputs
were already non-finite, ``weights`` when the first op whose output was non-finite read a
non-finite parameter or buffer of the model, else ``producer``; the earliest of these wins.

**Cause**, only where unambiguous (else ``None``): ``division_by_zero`` when a division's divisor
(``div``, ``reciprocal``, ``rsqrt``, ``addcdiv``) is zero where the output went non-finite;
``domain_error`` for sqrt/log/pow... of a negative (or log of zero); ``overflow`` when every
operand was finite, the new classes are ±inf and the float64 re-run is finite but beyond the
output dtype's max.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

SEVERITY = ("nan", "posinf", "neginf")
# factories whose output is whatever was in memory: never an event
UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}
DIVISIONS = {"div": 1, "true_divide": 1, "divide": 1, "reciprocal": 0, "rsqrt": 0, "addcdiv": 2}
DOMAIN = {"sqrt", "log", "log2", "log10", "log1p", "pow", "acos", "asin", "acosh", "atanh", "rsqrt"}


# --- values -----------------------------------------------------------------------------------


def value_of(t: Any) -> torch.Tensor | None:
    """A plain floating tensor holding ``t``'s values, or None (not a floating tensor, or a tensor
    subclass the oracle cannot read). torchao's ``Float8TrainingTensor``: ``_data / _scale`` in its
    original dtype (torchao's ``to_original_precision``)."""
    if not isinstance(t, torch.Tensor):
        return None
    if type(t) in (torch.Tensor, nn.Parameter):
        if t.is_floating_point():
            return t.detach() if t.dtype.itemsize > 1 else t.detach().float()
        return None
    if all(hasattr(t, a) for a in ("_data", "_scale", "_orig_dtype")):  # torchao float8 training tensor
        data, scale = t._data, t._scale
        if type(data) is torch.Tensor and type(scale) is torch.Tensor:
            return data.to(t._orig_dtype) / scale
    return None


def classes(v: torch.Tensor | None) -> frozenset[str]:
    if v is None or v.numel() == 0:
        return frozenset()
    found = []
    if bool(torch.isnan(v).any()):
        found.append("nan")
    if bool((v == float("inf")).any()):
        found.append("posinf")
    if bool((v == float("-inf")).any()):
        found.append("neginf")
    return frozenset(found)


def kind_of(cls: frozenset[str]) -> str | None:
    return next((k for k in SEVERITY if k in cls), None)


def finite_absmax(v: torch.Tensor | None) -> float | None:
    """Largest |x| over the finite elements (None when there are none)."""
    if v is None or v.numel() == 0:
        return None
    a = v.detach().double().abs()
    a = a[torch.isfinite(a)]
    return float(a.max()) if a.numel() else None


def tensors_in(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor in a module's output or inputs: tensors, sequences, mappings (``ModelOutput``),
    in order. Cache objects and other containers are not entered."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 6:
        return []
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensors_in(x, depth + 1)]
    if isinstance(obj, Mapping):
        return [t for x in obj.values() for t in tensors_in(x, depth + 1)]
    return []


def clone_tree(obj: Any, depth: int = 0) -> Any:
    """A copy of ``obj`` whose tensors are detached clones (other objects kept as they are)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if depth > 6:
        return obj
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(clone_tree(x, depth + 1) for x in obj)
    if isinstance(obj, list):
        return [clone_tree(x, depth + 1) for x in obj]
    if type(obj) is dict:
        return {k: clone_tree(v, depth + 1) for k, v in obj.items()}
    return obj


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The operands an op writes (in-place ``self``, ``out=``), from its schema."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        out += [t for t in tensors_in(v)]
    return out


def _is_view(func) -> bool:
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


# --- records ----------------------------------------------------------------------------------


@dataclass
class Operand:
    index: int  # position among the op's tensor operands (args, then kwargs)
    dtype: str
    shape: list[int]
    absmax: float | None  # over finite elements, of the value as the oracle reads it
    classes: frozenset[str]
    min_abs_nonzero: float | None = None
    zeros: int = 0
    numel: int = 0


@dataclass
class Event:
    """One aten op whose output holds a non-finite class none of its operands held."""

    seq: int
    op: str
    phase: str
    step: int
    module: str | None  # innermost module (forward), the node's module (backward), None (optimizer)
    frame: int | None  # id of the module call it ran in (forward)
    new: frozenset[str]
    out: frozenset[str]
    kind: str
    out_dtype: str | None
    operands: list[Operand]
    exact_absmax: float | None  # the op re-run in float64 from its operands (finite elements)
    exact_finite: bool | None
    cause: str | None
    grad_fn: str | None = None
    row: int | None = None  # batch row of the first new value (token models)
    token: int | None = None  # token index within this call's input of that row
    position: int | None = None  # index into that row's own tokens (padding not counted)
    token_id: int | None = None  # the input token at that position
    reached: bool | None = None  # forward: did the innermost module call's output hold a non-finite value
    completed: int | None = None  # forward, reached: the order in which that module call finished
    written_param: str | None = None  # optimizer: the parameter the op wrote, if any


@dataclass
class Frame:
    id: int
    name: str
    module: nn.Module
    mark: int | None  # autograd sequence number before the call (None: no graph being built)
    inputs: Any = None  # (args, kwargs) cloned at the call


@dataclass
class StepContext:
    step: int
    ids: torch.Tensor | None
    mask: torch.Tensor | None
    past: int
    autocast: tuple[str, str] | None


@dataclass
class Truth:
    """The oracle's answer: where the first fault is, by the contract's rules (module docstring)."""

    role: str
    phase: str
    step: int
    module: str | None
    op: str | None
    kind: str
    cause: str | None
    position: int | None = None
    row: int | None = None
    token_id: int | None = None
    grad_fn: str | None = None
    param: str | None = None
    event: Event | None = None
    replay: dict[str, dict[str, Any]] | None = None  # the producer module re-run per dtype
    optimizer_facts: dict[str, Any] | None = None  # optimizer faults: counts after the step (_after_step)

    @property
    def operand_absmax(self) -> list[float]:
        return [o.absmax for o in (self.event.operands if self.event else []) if o.absmax is not None]


class Tracer(TorchDispatchMode):
    """``with Tracer(model, optimizer=opt) as tr: ...`` then ``tr.truth()``. See the module docstring."""

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, max_snapshots: int = 16
    ):
        super().__init__()
        self.model = model
        self.optimizer = optimizer
        self.names = {id(m): n for n, m in model.named_modules()}
        self.param_names = {id(p): n for n, p in model.named_parameters()}
        self.events: list[Event] = []
        self.step = -1
        self.ctx: StepContext | None = None
        self.stack: list[Frame] = []
        self.frame_ids = itertools.count()
        self.completions = itertools.count()
        self.seq = itertools.count()
        self.quiet = False
        self.in_optimizer = False
        self.labels: dict[Any, str] = {}  # autograd node -> module name
        self.input_event: dict[str, Any] | None = None
        self.weights_event: Event | None = None
        self.param_fault: dict[str, Any] | None = None
        self.snapshots: dict[
            int, tuple
        ] = {}  # event seq -> (module, its state, its call's inputs, new classes)
        self.max_snapshots = max_snapshots
        self._probe = torch.zeros((), requires_grad=True)
        self._handles: list[Any] = []
        self._owned: dict[int, str] = {}  # storage pointer of a parameter/buffer -> its name

    # -- context ---------------------------------------------------------------------------------

    def __enter__(self):
        mod = torch.nn.modules.module
        self._handles = [
            mod.register_module_forward_pre_hook(self._pre),
            mod.register_module_forward_hook(self._post),
        ]
        for m in self.model.modules():
            self._handles.append(m.register_forward_pre_hook(self._inputs, with_kwargs=True))
        if self.optimizer is not None:
            self._handles += [
                self.optimizer.register_step_pre_hook(self._opt_pre),
                self.optimizer.register_step_post_hook(self._opt_post),
            ]
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for h in self._handles:
                h.remove()
            self._handles = []

    # -- module stack ----------------------------------------------------------------------------

    def _pre(self, module: nn.Module, args: tuple) -> None:
        name = self.names.get(id(module))
        if name is None:
            return
        if module is self.model:
            self.step += 1
            self.stack = []
        mark = None
        if torch.is_grad_enabled():
            self.quiet = True
            try:
                mark = (self._probe * 1).grad_fn._sequence_nr()
            finally:
                self.quiet = False
        self.stack.append(Frame(next(self.frame_ids), name, module, mark))

    def _inputs(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Per-module pre-hook (after the global one): the call's inputs, and the root's context."""
        self.quiet = True
        try:
            if self.stack and self.stack[-1].module is module:
                self.stack[-1].inputs = clone_tree((args, kwargs))
            if module is self.model:
                self._root_context(args, kwargs)
        finally:
            self.quiet = False

    def _root_context(self, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids")
        if ids is None and args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point():
            ids = args[0]
        mask = kwargs.get("attention_mask")
        past = 0
        if ids is not None and isinstance(mask, torch.Tensor) and mask.dim() == 2:
            past = mask.shape[1] - ids.shape[-1]  # the mask covers the cached tokens and this call's
        else:  # no mask (transformers drops an all-ones one): the cache's length, whatever its name
            mask = None
            cache = next((v for v in kwargs.values() if hasattr(v, "get_seq_length")), None)
            if cache is not None:
                past = int(cache.get_seq_length())
        ac = None
        if torch.is_autocast_enabled("cpu"):
            ac = ("cpu", str(torch.get_autocast_dtype("cpu")).replace("torch.", ""))
        self.ctx = StepContext(
            self.step,
            ids.detach().clone() if ids is not None else None,
            mask.detach().clone() if mask is not None else None,
            past,
            ac,
        )
        floats = [t for t in tensors_in((args, kwargs)) if t.is_floating_point()]
        bad = frozenset().union(*[classes(value_of(t)) for t in floats]) if floats else frozenset()
        if bad and self.input_event is None:
            self.input_event = {"seq": next(self.seq), "step": self.step, "kind": kind_of(bad)}

    def _post(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self.names.get(id(module)) is None:
            return
        idx = next((i for i in range(len(self.stack) - 1, -1, -1) if self.stack[i].module is module), None)
        if idx is None:
            return
        frame = self.stack[idx]
        del self.stack[idx:]
        self.quiet = True
        try:
            outs = [t for t in tensors_in(output)]
            out_cls = frozenset().union(*[classes(value_of(t)) for t in outs]) if outs else frozenset()
            order = next(self.completions)
            for ev in [*self.events, *([self.weights_event] if self.weights_event else [])]:
                if ev.frame == frame.id and ev.reached is None:
                    ev.reached = bool(out_cls)
                    if not out_cls:  # absorbed: not a fault, nothing to replay
                        self.snapshots.pop(ev.seq, None)
                        continue
                    ev.completed = order
                    if ev.row is None:  # the op's output has no token rows (a weight cast)
                        self._locate_row(ev, outs, out_cls)
            if frame.mark is not None:
                self._label(frame, outs)
        finally:
            self.quiet = False

    def _label(self, frame: Frame, outs: list[torch.Tensor]) -> None:
        """Name the autograd nodes created during this call after its module (innermost first:
        inner calls finish, and label, before their parents)."""
        todo = [t.grad_fn for t in outs if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or node in self.labels:
                continue
            if type(node).__name__ == "AccumulateGrad":
                self.labels[node] = frame.name
                continue
            if node._sequence_nr() < frame.mark:
                continue
            self.labels[node] = frame.name
            todo += [n for n, _ in node.next_functions if n is not None]

    # -- optimizer -------------------------------------------------------------------------------

    def _params(self) -> list[nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _opt_pre(self, opt, args, kwargs) -> None:
        self.quiet = True
        try:
            self._before = [
                (bool(torch.isfinite(p.detach()).all()), p.grad is None or bool(torch.isfinite(p.grad).all()))
                for p in self._params()
            ]
        finally:
            self.quiet = False
        self.in_optimizer = True

    def _opt_post(self, opt, args, kwargs) -> None:
        self.in_optimizer = False
        if self.param_fault is not None:
            return
        self.quiet = True
        try:
            for p, (fin, gfin) in zip(self._params(), self._before):
                now = classes(p.detach())
                if fin and gfin and now:
                    name = self.param_names.get(id(p), "?")
                    self.param_fault = {
                        "param": name,
                        "module": name.rpartition(".")[0],
                        "kind": kind_of(now),
                        "step": self.step,
                        "seq": next(self.seq),
                        **_after_step(opt, p),
                    }
                    break
        finally:
            self.quiet = False

    # -- ops -------------------------------------------------------------------------------------

    def _owner(self, t: torch.Tensor) -> str | None:
        """The name of the model parameter or buffer ``t`` shares storage with."""
        if not self._owned:
            for n, p in itertools.chain(self.model.named_parameters(), self.model.named_buffers()):
                if type(p) in (torch.Tensor, nn.Parameter):
                    self._owned[p.untyped_storage().data_ptr()] = n
        if type(t) not in (torch.Tensor, nn.Parameter):
            return None
        try:
            return self._owned.get(t.untyped_storage().data_ptr())
        except Exception:  # noqa: BLE001 - storages the oracle cannot read
            return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        base = func.overloadpacket.__name__
        if self.quiet or base in UNINITIALISED or _is_view(func):
            return func(*args, **kwargs)
        written = _written(func, args, kwargs)
        flat, _ = tree_flatten((args, kwargs))
        operands = [t for t in flat if isinstance(t, torch.Tensor)]
        written_ids = {id(t) for t in written}
        before: dict[int, torch.Tensor] = {}
        for t in operands:
            if id(t) in written_ids and id(t) not in before:
                v = value_of(t)
                if v is not None:
                    before[id(t)] = v.clone()
        values = [before.get(id(t), value_of(t)) for t in operands]
        in_cls = [classes(v) for v in values]
        out = func(*args, **kwargs)
        outs = [t for t in tensors_in(out) if isinstance(t, torch.Tensor)] or written
        out_cls = frozenset().union(*[classes(value_of(t)) for t in outs]) if outs else frozenset()
        if not out_cls:
            return out
        held = frozenset().union(*in_cls) if in_cls else frozenset()
        new = out_cls - held
        if new:
            self._event(func, args, kwargs, operands, values, in_cls, outs, out_cls, new, before)
        elif self.weights_event is None and self.phase() == "forward":
            for t, c in zip(operands, in_cls):
                if c and self._owner(t) is not None:
                    self.weights_event = self._make(
                        func, args, kwargs, operands, values, in_cls, outs, out_cls, frozenset(), before
                    )
                    self.weights_event.written_param = self._owner(t)
                    if self.stack:
                        fr = self.stack[-1]
                        state = {k: v.detach().clone() for k, v in fr.module.state_dict().items()}
                        self.snapshots[self.weights_event.seq] = (fr.module, state, fr.inputs, frozenset())
                    break
        return out

    def phase(self) -> str:
        if self.in_optimizer:
            return "optimizer"
        return "backward" if torch._C._current_autograd_node() is not None else "forward"

    def _make(self, func, args, kwargs, operands, values, in_cls, outs, out_cls, new, before) -> Event:
        phase = self.phase()
        ops = []
        for i, (v, c) in enumerate(zip(values, in_cls)):
            if v is None:
                continue
            nz = v.detach().double().abs()
            nz = nz[(nz > 0) & torch.isfinite(nz)]
            ops.append(
                Operand(
                    i,
                    str(v.dtype).replace("torch.", ""),
                    list(v.shape),
                    finite_absmax(v),
                    c,
                    float(nz.min()) if nz.numel() else None,
                    int((v == 0).sum()),
                    v.numel(),
                )
            )
        exact = _exact(func, args, kwargs, before)
        module = grad_fn = None
        frame = None
        if phase == "forward" and self.stack:
            module, frame = self.stack[-1].name, self.stack[-1].id
        elif phase == "backward":
            node = torch._C._current_autograd_node()
            module = self.labels.get(node)
            grad_fn = type(node).__name__
        out_t = outs[0] if outs else None
        ev = Event(
            seq=next(self.seq),
            op=str(func),
            phase=phase,
            step=self.step,
            module=module,
            frame=frame,
            new=new,
            out=out_cls,
            kind=kind_of(out_cls),
            out_dtype=str(out_t.dtype).replace("torch.", "") if out_t is not None else None,
            operands=ops,
            exact_absmax=finite_absmax(exact) if exact is not None else None,
            exact_finite=bool(torch.isfinite(exact).all()) if exact is not None else None,
            cause=None,
            grad_fn=grad_fn,
        )
        if phase == "optimizer":
            ev.written_param = next(
                (self._owner(t) for t in _written(func, args, kwargs) if self._owner(t)), None
            )
        ev.cause = _cause(func, ev, values, outs)
        if phase == "forward":
            self._locate_row(ev, outs, new or out_cls)  # a weights event: every non-finite class is read
        return ev

    def _event(self, func, args, kwargs, operands, values, in_cls, outs, out_cls, new, before) -> None:
        ev = self._make(func, args, kwargs, operands, values, in_cls, outs, out_cls, new, before)
        self.events.append(ev)
        # absorbed events give theirs back when their module call ends (_post): the cap bounds the rest
        if ev.phase == "forward" and self.stack and len(self.snapshots) < self.max_snapshots:
            fr = self.stack[-1]
            state = {k: v.detach().clone() for k, v in fr.module.state_dict().items()}
            self.snapshots[ev.seq] = (fr.module, state, fr.inputs, ev.new)

    def _locate_row(self, ev: Event, outs: list[torch.Tensor], new: frozenset[str]) -> None:
        """Batch row and token of the first row holding a new non-finite value, mapped onto the
        output's dims from this call's input ids: a dim of size B first, then a dim of size T
        (or one dim of size B·T); then the position in that row's own tokens, from the mask."""
        ctx = self.ctx
        if ctx is None or ctx.ids is None or ctx.ids.dim() != 2:
            return
        b_n, t_n = ctx.ids.shape
        for t in outs:
            v = value_of(t)
            if v is None or not (classes(v) & new):
                continue
            bad = torch.zeros_like(v, dtype=torch.bool)
            if "nan" in new:
                bad |= torch.isnan(v)
            if "posinf" in new:
                bad |= v == float("inf")
            if "neginf" in new:
                bad |= v == float("-inf")
            shape = list(bad.shape)
            if len(shape) >= 2 and shape[0] == b_n and t_n in shape[1:]:
                bad = bad.movedim(1 + shape[1:].index(t_n), 1).reshape(b_n, t_n, -1)
            elif shape and shape[0] == b_n * t_n:  # a matmul on the flattened (batch·tokens) rows
                bad = bad.reshape(b_n, t_n, -1)
            else:
                return
            rows = bad.any(-1).nonzero()
            if not len(rows):
                return
            b, tok = (int(x) for x in rows[0])
            ev.row, ev.token = b, tok
            col = ctx.past + tok
            if ctx.mask is not None:
                ev.position = int(ctx.mask[b, : col + 1].sum()) - 1
            else:
                ev.position = col
            ev.token_id = int(ctx.ids[b, tok])
            return

    # -- the answer ------------------------------------------------------------------------------

    def truth(self, replay_dtypes: tuple[torch.dtype, ...] = ()) -> Truth | None:
        """The first fault by the rules of the module docstring (None: the run stayed finite)."""
        cands: list[tuple[int, str, Any]] = []
        if self.input_event is not None:
            cands.append((self.input_event["seq"], "input", self.input_event))
        if self.weights_event is not None:
            cands.append((self.weights_event.seq, "weights", self.weights_event))
        # the producer's call is the first to finish with a non-finite output (completion order, as
        # an outer call that only holds a mask finishes after the inner call that made the fault)
        reached = [e for e in self.events if e.phase == "forward" and e.reached]
        fwd = min(reached, key=lambda e: (e.completed, e.seq)) if reached else None
        if fwd is not None:
            cands.append((fwd.seq, "forward", fwd))
        bwd = [e for e in self.events if e.phase == "backward"]
        if bwd:
            cands.append((bwd[0].seq, "backward", bwd[0]))
        if self.param_fault is not None:
            first_opt = next((e for e in self.events if e.phase == "optimizer"), None)
            seq = min(self.param_fault["seq"], first_opt.seq if first_opt else self.param_fault["seq"])
            cands.append((seq, "optimizer", first_opt))
        if not cands:
            return None
        _, what, ev = min(cands, key=lambda c: c[0])
        if what == "input":
            return Truth("input", "forward", ev["step"], None, None, ev["kind"], "nonfinite_input")
        if what == "weights":
            t = Truth(
                "weights",
                "forward",
                ev.step,
                ev.written_param.rpartition(".")[0],
                ev.op,
                ev.kind,
                "nonfinite_weights",
                event=ev,
                row=ev.row,
                position=ev.position,
                token_id=ev.token_id,
            )
            if replay_dtypes:
                t.replay = self.replay(ev, replay_dtypes)
            return t
        if what == "optimizer":
            pf = self.param_fault
            op_ev = next(
                (e for e in self.events if e.phase == "optimizer" and e.written_param == pf["param"]), ev
            )
            return Truth(
                "producer",
                "optimizer",
                pf["step"],
                pf["module"],
                op_ev.op if op_ev else None,
                pf["kind"],
                op_ev.cause if op_ev else None,
                param=pf["param"],
                event=op_ev,
                optimizer_facts=pf,
            )
        if what == "backward":
            same = [e for e in bwd if e.step == ev.step]
            pick = next((e for e in same if e.new & {"nan", "posinf"}), ev)
            return Truth(
                "producer",
                "backward",
                pick.step,
                pick.module,
                pick.op,
                pick.kind,
                pick.cause,
                grad_fn=pick.grad_fn,
                event=pick,
            )
        in_call = [e for e in self.events if e.frame == ev.frame]
        pick = next((e for e in in_call if e.new & {"nan", "posinf"}), ev)
        t = Truth(
            "producer",
            "forward",
            pick.step,
            pick.module,
            pick.op,
            pick.kind,
            pick.cause,
            position=pick.position,
            row=pick.row,
            token_id=pick.token_id,
            event=pick,
        )
        if replay_dtypes:
            t.replay = self.replay(pick, replay_dtypes)
        return t

    def replay(self, ev: Event, dtypes: tuple[torch.dtype, ...]) -> dict[str, dict[str, Any]] | None:
        """The event's module re-run from the inputs and weights of its call, in each dtype (a copy
        cast to it, floating inputs too, no autocast): finite, and absmax over the finite elements
        of every floating output."""
        snap = self.snapshots.get(ev.seq)
        if snap is None or snap[2] is None:
            return None
        module, state, (args, kwargs), _ = snap
        res = {}
        for dt in dtypes:
            m = copy.deepcopy(module)
            m.load_state_dict(state)
            m = m.to(dt).eval()

            def cast(x, dt=dt):
                if isinstance(x, torch.Tensor) and x.is_floating_point():
                    return x.detach().clone().to(dt)
                if isinstance(x, tuple):
                    return tuple(cast(y) for y in x)
                if isinstance(x, list):
                    return [cast(y) for y in x]
                if type(x) is dict:
                    return {k: cast(v) for k, v in x.items()}
                return x

            try:
                with torch.no_grad():
                    out = m(*cast(args), **cast(kwargs))
            except Exception as e:  # noqa: BLE001 - no kernel for this dtype (torchao in float64)
                res[str(dt).replace("torch.", "")] = {"error": type(e).__name__}
                continue
            vals = [t for t in tensors_in(out) if t.is_floating_point()]
            absmaxes = [a for a in (finite_absmax(t) for t in vals) if a is not None]
            res[str(dt).replace("torch.", "")] = {
                "finite": all(bool(torch.isfinite(t).all()) for t in vals),
                "absmax": max(absmaxes) if absmaxes else None,
            }
        return res


def _after_step(opt: torch.optim.Optimizer, p: torch.Tensor) -> dict[str, Any]:
    """What explains a parameter the step made non-finite: how many of its elements went bad, and
    at those elements the zeros of its gradient and of each floating state tensor after the step."""
    bad = ~torch.isfinite(p.detach())
    facts: dict[str, Any] = {
        "dtype": str(p.dtype).replace("torch.", ""),
        "n_bad": int(bad.sum()),
        "numel": p.numel(),
        "state": {},
    }
    if p.grad is not None:
        g = p.grad.detach()
        facts["grad_zeros_bad"] = int(((g == 0) & bad).sum())
        facts["grad_absmax"] = finite_absmax(g)
    for k, v in opt.state.get(p, {}).items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.shape == p.shape:
            facts["state"][k] = {
                "zeros_bad": int(((v == 0) & bad).sum()),
                "zeros": int((v == 0).sum()),
                "dtype": str(v.dtype).replace("torch.", ""),
            }
    return facts


def _exact(func, args, kwargs, before: dict[int, torch.Tensor]) -> torch.Tensor | None:
    """The op re-run in float64 from its operands as the oracle reads them (a written operand as it
    was before the op). ``_scaled_mm`` is (a · scale_a) @ (b · scale_b) (+ bias)."""
    base = func.overloadpacket.__name__

    def to64(x):
        if isinstance(x, torch.Tensor):
            v = before.get(id(x))
            if v is None:
                v = value_of(x)
            return v.double().clone() if v is not None else x
        if isinstance(x, torch.dtype) and x.is_floating_point:
            return torch.float64
        if isinstance(x, (list, tuple)):
            return type(x)(to64(y) for y in x)
        return x

    try:
        if base == "_scaled_mm":
            a, b, sa, sb = (to64(x) for x in args[:4])
            r = (a * sa) @ (b * sb)
            bias = kwargs.get("bias", args[4] if len(args) > 4 else None)
            return r + to64(bias) if bias is not None else r
        a64 = to64(args)
        kw64 = {k: to64(v) for k, v in kwargs.items()}
        r = func(*a64, **kw64)
        outs = [t for t in tensors_in(r) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not outs:
            written = _written(func, a64, kw64)
            outs = [t for t in written if t.is_floating_point()]
        return torch.cat([o.reshape(-1) for o in outs]) if outs else None
    except Exception:  # noqa: BLE001 - ops without a float64 kernel: no exact magnitude
        return None


def _cause(func, ev: Event, values: list[torch.Tensor | None], outs: list[torch.Tensor]) -> str | None:
    """The oracle's own classification, only where it is unambiguous (module docstring)."""
    base = func.overloadpacket.__name__.rstrip("_")
    if any(o.classes for o in ev.operands):
        return None
    out = value_of(outs[0]) if outs else None
    if base in DIVISIONS and out is not None:
        i = DIVISIONS[base]
        divisor = values[i] if i < len(values) else None
        bad = ~torch.isfinite(out)
        if divisor is None and i == 1:  # x / python scalar
            return None
        try:
            zero = torch.broadcast_to(divisor == 0, bad.shape)
        except RuntimeError:
            zero = None
        if zero is not None and bool((bad & zero).any()):
            return "division_by_zero"
    if base in DOMAIN and out is not None and "nan" in ev.new and values and values[0] is not None:
        x = values[0]
        try:
            if bool((torch.broadcast_to(x < 0, out.shape) & torch.isnan(out)).any()):
                return "domain_error"
        except RuntimeError:
            pass
    if (
        base.startswith("log")
        and out is not None
        and ev.new == frozenset({"neginf"})
        and values[0] is not None
    ):
        return "domain_error"
    if ev.new <= {"posinf", "neginf"} and ev.exact_finite and ev.exact_absmax is not None and ev.out_dtype:
        lim = torch.finfo(getattr(torch, ev.out_dtype)).max
        if ev.exact_absmax > lim:
            return "overflow"
    return None
