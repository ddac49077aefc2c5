"""``TraceRecorder``: writes a ``nanhunter.trace/v1`` file while the model runs.

It is an observer of the one recording (``capture.listener.CallObserver``): the capture
``Recorder`` hooks the model (every module, the root outside a compiled region, the DDP and
compiled wrappers unwrapped), finds the model's source lines (``Recorder.source_site``) and keeps
its own statistics out of the trace's op mode; the trace only measures and writes. A watch's, or a
scan's, trace is written in the same pass as its capture; alone (``with TraceRecorder(model,
path)``) it runs on a bare recorder that captures nothing itself.

Level ``"modules"``: one entry per module call, in completion
order (innermost first, so a call's children come before it), with the statistics of its
floating outputs and, under ``input``, of its floating inputs. Level ``"ops"``: the module hooks
only keep the stack of running calls, and a ``TorchDispatchMode`` makes one entry per aten op
run inside the model's forward that returns a floating tensor, with ``producers``: the entry that
made each tensor operand (None for weights, inputs and values made outside the trace). Ops that
only move or alias data (views, ``clone``, ``detach``...) pass their operand's producer on
without an entry; ops that allocate without writing (``empty``) make none. Every entry names the
dtypes of its floating inputs (``input_dtypes``: what ``diff`` takes the tolerance from); at level
ops the entries that made the root call's floating outputs carry ``output: true`` (what ``diff``
judges the outputs by).

Nothing is changed: the hooks and the mode only read, and outputs are bitwise those of a run
without them. Statistics of a tensor already measured in this root call (a parent returning its
last child's output) are reused. Entries are written when a root call ends (``--repeat``: when
the input's last re-run ends), so memory holds one root call's entries at most.

A compiled region is opaque, as for capture (``capture.compiled_regions``): hooks inside it do
nothing while dynamo traces, so a compiled model's trace holds the calls that run outside
compiled code (the root, and the wrappers of compiled submodules). With ``compile_backend`` (``scan
--compile --trace``) at level modules, each root call of a ``torch.compile``d model first records
the module boundaries (``boundaries``): every module call of an eager run, computed by that module
compiled alone on eager's inputs, so ``diff`` against eager names the module where compile
changed the numbers, not only the root.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from ..capture.compiled_regions import compiling, eager_named_modules
from ..capture.listener import CallObserver
from ..tree import float_tensors
from .env import environment, inputs_hash, model_identity
from .format import LEVELS, TraceWriter, entry_line
from .rule import spread_of
from .stats import Digest, combine, digest, dtype_name

#: ops that move, alias or copy data without computing: their output is their operand's value
PASS_THROUGH = frozenset(
    (
        "view",
        "_unsafe_view",
        "reshape",
        "t",
        "permute",
        "transpose",
        "expand",
        "expand_as",
        "unsqueeze",
        "squeeze",
        "slice",
        "select",
        "as_strided",
        "alias",
        "detach",
        "clone",
        "contiguous",
        "lift_fresh",
        "lift_fresh_copy",
        "unfold",
        "view_as",
        "_reshape_alias",
        "split",
        "split_with_sizes",
        "unbind",
        "chunk",
        "narrow",
        "flatten",
        "movedim",
        "diagonal",
        "_to_copy_same_dtype",
        "view_as_real",
        "view_as_complex",
        "unflatten",
    )
)
#: ops whose output holds whatever memory held: no entry, no producer
UNWRITTEN = frozenset(("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_"))


def _float_dtypes(tensors: Any) -> list[str]:
    """The distinct dtypes of the floating tensors among ``tensors``, in first-seen order."""
    out: list[str] = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            name = dtype_name(t.dtype)
            if name not in out:
                out.append(name)
    return out


class _Call:
    __slots__ = ("name", "module_type", "call_index", "source", "inputs", "input_dtypes")

    def __init__(
        self,
        name: str,
        module_type: str,
        call_index: int,
        source: tuple[str, int] | None,
        inputs: Digest | None,
        input_dtypes: list[str] | None = None,
    ) -> None:
        self.name, self.module_type, self.call_index = name, module_type, call_index
        self.source, self.inputs, self.input_dtypes = source, inputs, input_dtypes


class _OpTrace(TorchDispatchMode):
    """Level "ops": one entry per aten op run inside a module call (see the module docstring)."""

    def __init__(self, rec: TraceRecorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        rec = self.rec
        if not rec.recording():
            return out
        try:
            rec.on_op(func, args, kwargs, out)
        except Exception as e:  # noqa: BLE001 - a statistic never breaks the user's forward
            rec.failures.append(f"{func}: {type(e).__name__}: {e}")
        return out


class TraceRecorder(CallObserver):
    """Writes a trace of the model's runs to ``path`` (module docstring): an observer of a
    ``capture.Recorder`` (``Recorder(..., observers=[trace])``), or alone as a context manager
    over ``model`` (a bare recorder of its own that captures nothing).

    ``repeat``: with N ≥ 2, each input (``input(i)``) is run N times by the caller (``run(r)``)
    and every entry stores the largest run-to-run spread. ``paused``: a callable; while it says
    True nothing is recorded (the recorder's own pause covers a report's re-runs).
    ``dtype``/``compile_backend``: recorded in the environment. Without ``input(i)``, every root
    call is one step of input 0 (a watch)."""

    def __init__(
        self,
        model: nn.Module | None,
        path: str | os.PathLike,
        level: str = "modules",
        repeat: int | None = None,
        dtype: str | None = None,
        compile_backend: str | None = None,
        paused: Callable[[], bool] | None = None,
        inputs: list[dict[str, Any]] | None = None,
        **header: Any,
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"trace level must be one of {LEVELS}, got {level!r}")
        if repeat is not None and (isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 2):
            raise ValueError(f"repeat must be an integer of at least 2, got {repeat!r}")
        self.given = model  # alone: the model its own bare recorder hooks
        self.rec: Any = None  # the capture.Recorder it observes (attached)
        self.model: nn.Module | None = None  # the recorder's unwrapped model
        self._compiled = False  # the recorder's root is a compiled wrapper
        self._alone: Any = None
        self.keep_open = False  # the file outlives each recorder it observes (a scan's groups): see close
        self.path = os.fspath(path)
        self.level = level
        self.repeat = repeat
        self.dtype = dtype
        self.compile_backend = compile_backend
        self.paused = paused or (lambda: False)
        self.inputs = inputs
        self.header_extra = header
        self.failures: list[str] = []
        self.first_failed: int | None = None  # the first step with a non-finite entry (generate stops there)
        self.writer: TraceWriter | None = None
        self._stack: list[_Call] = []
        self._count: dict[str, int] = {}
        self._cache: dict[int, tuple[weakref.ref, int, Digest]] = {}
        self._made: dict[int, tuple[weakref.ref, int]] = {}
        self._input_index: int | None = None
        self._step = -1
        self._run = 0
        self._base = 0  # the index of the first entry of the current input (or root call)
        self._pending: list[dict[str, Any]] = []  # entries not yet written (run 0)
        self._stats: list[list[Any]] = []  # per run after the first: (key, Digest) per entry
        self._digests: list[tuple[Any, Digest]] = []  # run 0: (key, Digest) per pending entry
        self.repeat_mismatch = 0

    # -- attaching ----------------------------------------------------------------------------
    def __enter__(self) -> TraceRecorder:
        """Alone: a bare recorder of ``model`` (no capture of its own) with this trace its observer."""
        from ..capture.recorder import Recorder  # lazy: a trace observing a watch's recorder needs none

        if self.given is None:
            raise ValueError("TraceRecorder without a model observes a capture.Recorder (observers=[...])")
        self._alone = Recorder(self.given, capture=False, observers=[self])
        self._alone.attach()
        return self

    def __exit__(self, *exc: Any) -> None:
        alone, self._alone = self._alone, None
        if alone is not None:
            alone.detach()

    def attached(self, recorder: Any) -> None:
        self.rec = recorder
        self.model = recorder.model
        self._compiled = recorder.root_hooked is not recorder.model
        if self.writer is None or self.writer.closed:
            self.writer = TraceWriter(self.path)

    def op_mode(self) -> Any:
        return _OpTrace(self) if self.level == "ops" else None

    def repeats(self) -> int:
        return self.repeat or 1

    def detached(self) -> None:
        """The recorder is gone: what is pending is written, and the file closed unless the trace
        spans several recordings (``keep_open``: a scan's groups; its pass calls ``close``)."""
        self._stack.clear()
        if self.writer is not None and not self.writer.closed:
            self._flush()
            if not self.keep_open:
                self.close()

    def close(self) -> None:
        if self.writer is not None and not self.writer.closed:
            self._flush()
            if self.writer.entries == 0 and not self._header_written:
                self._write_header((), {})
            self.writer.close(repeat_mismatch=self.repeat_mismatch, unmeasured=len(self.failures))

    _header_written = False
    _quiet = False  # the recorder's own runs (module boundaries of a compiled model): nothing recorded

    # -- inputs and repeats (driven by the caller) ---------------------------------------------
    @contextlib.contextmanager
    def input(self, index: int) -> Iterator[None]:
        """Root calls inside are the steps of data-set input ``index``."""
        self._input_index, self._step = index, -1
        self._base = self.writer.entries if self.writer else 0
        try:
            yield
        finally:
            self._flush()
            self._input_index = None

    @contextlib.contextmanager
    def run(self, r: int) -> Iterator[None]:
        """Re-run ``r`` (0 first) of the current input: runs after the first are compared with it."""
        self._run, self._step = r, -1
        self._made.clear()
        if r > 0:
            self._stats.append([])
        try:
            yield
        finally:
            self._run = 0

    def recording(self) -> bool:
        return bool(self._stack) and not self._quiet and not self.paused() and not compiling()

    # -- module calls (the recorder's hooks call these) ------------------------------------------
    def call_start(self, name: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._quiet or self.paused():
            return
        if not self._stack:
            with _disable_current_modes():
                self._root_call(args, kwargs)
                if self._compiled and self.compile_backend and self.level == "modules":
                    self._boundaries(args, kwargs)
        idx = self._count.get(name, 0)
        self._count[name] = idx + 1
        source, inputs, dtypes = None, None, None
        if self.level == "modules":  # level ops: entries carry their op's own source line
            source = self.rec.source_site()
            with _disable_current_modes():
                inputs = self._digest_all((args, kwargs))
                dtypes = _float_dtypes(t for _, t in float_tensors((args, kwargs)))
        self._stack.append(_Call(name, type(module).__name__, idx, source, inputs, dtypes))

    def call_end(self, name: str, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not self._stack or self._quiet or self.paused():
            return
        while self._stack[-1].name != name and any(c.name == name for c in self._stack):
            self._stack.pop()  # calls whose post-hook a compiled region swallowed
        if self._stack[-1].name != name:
            return
        call = self._stack.pop()
        if self.level == "modules":
            with _disable_current_modes():
                d = self._digest_all(output)
            if d is not None:
                self._add(
                    call.name,
                    call.module_type,
                    None,
                    call.call_index,
                    call.source,
                    d,
                    None,
                    call.inputs,
                    call.input_dtypes,
                )
        elif not self._stack:
            self._mark_outputs(output)
        if not self._stack:
            self._root_done()

    def _root_call(self, args: tuple, kwargs: dict) -> None:
        self._step += 1
        self._count.clear()
        self._cache.clear()
        if self._input_index is None:  # a watch: every root call is written when it ends
            self._base = self.writer.entries if self.writer else 0
        if not self._header_written:
            self._write_header(args, kwargs)

    def _boundaries(self, args: tuple, kwargs: dict) -> None:
        """A compiled root call's module boundaries (module docstring): an entry per module call
        of an eager run, from the module compiled alone on that call's eager inputs."""
        from .boundaries import compiled_alone, eager_calls  # lazy: only a compiled run's trace needs it

        model, backend = self.model, self.compile_backend
        assert model is not None and backend is not None  # attached, and compiled with a backend (the caller)
        self._quiet = True
        try:
            calls = eager_calls(model, args, kwargs)
            for call, out, why in compiled_alone(calls, backend):
                d = self._digest_all(out) if why is None else None
                if d is None:
                    self.failures.append(why or f"{call.name}: no floating output when compiled alone")
                    continue
                ins = (call.args, call.kwargs)
                self._add(
                    call.name,
                    type(call.module).__name__,
                    None,
                    call.call_index,
                    None,
                    d,
                    None,
                    self._digest_all(ins),
                    _float_dtypes(t for _, t in float_tensors(ins)),
                )
        finally:
            self._quiet = False

    def _mark_outputs(self, output: Any) -> None:
        """Level ops, run 0: ``output: true`` on the pending entries that made the root call's
        floating outputs (a view of an entry's output counts as it)."""
        if self._run > 0:
            return
        for _, t in float_tensors(output):
            p = self.producer(t)
            if p is not None and 0 <= p - self._base < len(self._pending):
                self._pending[p - self._base]["output"] = True

    def _root_done(self) -> None:
        if self._input_index is None:
            self._flush()
        self._cache.clear()
        if self._made:
            self._made = {k: v for k, v in self._made.items() if v[0]() is not None}

    # -- measuring ----------------------------------------------------------------------------
    def _digest_one(self, t: torch.Tensor) -> Digest:
        cacheable = not t.is_inference()
        if cacheable:
            hit = self._cache.get(id(t))
            if hit is not None and hit[0]() is t and hit[1] == t._version:
                return hit[2]
        d = digest(t)
        if cacheable:
            try:
                self._cache[id(t)] = (weakref.ref(t), t._version, d)
            except TypeError:  # pragma: no cover - tensors without weakref support
                pass
        return d

    def _digest_all(self, obj: Any) -> Digest | None:
        parts = []
        for _, t in float_tensors(obj):
            if t.is_meta:
                continue
            try:
                parts.append(self._digest_one(t))
            except Exception as e:  # noqa: BLE001 - never break the user's forward over a statistic
                self.failures.append(f"{type(t).__name__} {t.dtype}: {type(e).__name__}: {e}")
        return combine(parts)

    def producer(self, t: torch.Tensor) -> int | None:
        hit = self._made.get(id(t))
        return hit[1] if hit is not None and hit[0]() is t else None

    def _made_by(self, outs: list[torch.Tensor], index: int | None) -> None:
        for o in outs:
            if index is None:
                self._made.pop(id(o), None)
                continue
            try:
                self._made[id(o)] = (weakref.ref(o), index)
            except TypeError:  # pragma: no cover
                pass

    def on_op(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """One aten op (level "ops"): an entry, or its operand's producer passed on."""
        name = func._opname if hasattr(func, "_opname") else str(func)
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if not outs:
            return
        if name in UNWRITTEN:
            self._made_by(outs, None)
            return
        ins = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        if name in PASS_THROUGH or (
            name == "_to_copy" and ins and all(o.dtype == ins[0].dtype for o in outs)
        ):
            self._made_by(outs, self.producer(ins[0]) if ins else None)
            return
        floats = [o for o in outs if o.is_floating_point() and not o.is_meta]
        if not floats:
            self._made_by(outs, None)
            return
        source = self.rec.source_site()
        d = combine([digest(o) for o in floats])
        assert d is not None  # floats is not empty
        call = self._stack[-1]
        index = self._add(
            call.name,
            call.module_type,
            str(func),
            call.call_index,
            source,
            d,
            [self.producer(x) for x in ins],
            None,
            _float_dtypes(ins),
        )
        self._made_by(outs, index)

    # -- entries ------------------------------------------------------------------------------
    def _add(
        self,
        module: str,
        module_type: str,
        op: str | None,
        call_index: int,
        source: tuple[str, int] | None,
        d: Digest,
        producers: list[int | None] | None,
        inputs: Digest | None,
        input_dtypes: list[str] | None = None,
    ) -> int:
        """Append an entry of the current run; returns its index (run 0: the index it is written
        at; later runs: the same numbering, for their producers)."""
        if d.nan or d.posinf:
            if self.first_failed is None:
                self.first_failed = self._step
        key = (module, op, call_index, self._step)
        if self._run > 0:
            runs = self._stats[-1]
            runs.append((key, d))
            return self._base + len(runs) - 1
        index = self._base + len(self._pending)
        input_index = self._input_index if self._input_index is not None else self._step
        self._pending.append(
            entry_line(
                index,
                module,
                module_type,
                op,
                call_index,
                input_index,
                self._step,
                "forward",
                source,
                d,
                None,
                producers,
                inputs,
                input_dtypes,
            )
        )
        self._digests.append((key, d))
        return index

    def _flush(self) -> None:
        """Write the pending entries of run 0, with their spread over the re-runs."""
        if not self._pending:
            self._stats.clear()
            return
        if self.repeat is not None:
            spreads: list[float | None] = [0.0] * len(self._pending)
            for runs in self._stats:
                for i, (key, d0) in enumerate(self._digests):
                    if i >= len(runs) or runs[i][0] != key:  # the re-run took another path here
                        self.repeat_mismatch += 1
                        spreads[i] = None
                        continue
                    prev = spreads[i]
                    if prev is not None:
                        spreads[i] = max(prev, spread_of(runs[i][1], d0, d0.dtype))
            for rec, s in zip(self._pending, spreads):
                rec["spread"] = s
        assert self.writer is not None
        for rec in self._pending:
            self.writer.entry(rec)
        self._pending.clear()
        self._digests.clear()
        self._stats.clear()
        self._base = self.writer.entries

    def _write_header(self, args: tuple, kwargs: dict) -> None:
        assert self.writer is not None and self.model is not None  # attached
        self._header_written = True
        device = next(
            (p.device for p in self.model.parameters() if p.device.type != "meta"), torch.device("cpu")
        )
        dtype = self.dtype
        if dtype is None:
            dt = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), None)
            dtype = dtype_name(dt) if dt is not None else None
        env = environment(device, dtype, self.compile_backend)
        inputs = self.inputs if self.inputs is not None else [{"index": 0, "hash": inputs_hash(args, kwargs)}]
        env["inputs"] = [i["hash"] for i in inputs]  # the contract's env holds the inputs' hashes too
        names = [n for n, _ in eager_named_modules(self.model)]
        self.writer.header(
            self.level, env, model_identity(self.model, names), inputs, self.repeat, **self.header_extra
        )
