"""Forward hooks on every module (or only on blocks) that record tensor statistics per call.

``Recorder`` attaches the hooks and records ``Call``s and stats rows; it never changes a tensor,
so outputs with and without capture are bitwise identical, and hooks are removed on detach even
when forward raises. The public ``nan_hunter.watch`` (``session.Watch``) builds on it and adds
``report()``.

Levels: ``"sentinel"`` hooks only the root, and judges no parameter per call: a step is judged
by its root outputs, and in training by one fused reduction over the gradients after backward and
over the parameters and optimizer state after ``optimizer.step()`` (``capture.sentinel``); only a
failing step is measured in detail, and ``report()`` replays it in full. ``sample_every=N`` hooks
the blocks too on steps N-1, 2N-1, ... (statistics for headroom; a non-finite block output the
root's outputs do not show is ``latent``, not a fault). ``"modules"`` hooks every module;
``"blocks"`` hooks only the repeated children of the model's main ModuleList and the root (a
block's parameters are those of its whole subtree, the root's those outside every block);
``"ops"`` adds per-op checks (a TorchDispatchMode) that also see intermediates absorbed before a
module output.

Bounded memory in long loops: the calls and rows of the latest ``retain`` forwards and of the
first failing forward are kept in full; every other forward is folded into per-module
aggregates (``aggregates``) and its rows are given back to the sink for reuse. Only the first
failing forward's inputs are needed by a report: they are kept (a snapshot, see
``capture.snapshot``) whatever came after. On a host sink (CPU) each forward is judged when it
ends, so those inputs are always there; a device sink judges forwards in batches of
``FOLD_BATCH`` (one read-back, so one host synchronisation per batch) and keeps inputs for the
latest ``retain`` forwards until then.

Training (``backward=True``, ``optimizer=opt``): backward calls (``capture.gradients``) and
optimizer steps (``capture.optimizer_step``) are recorded as further phases of the step whose
forward they follow, into the same sink and the same per-forward bookkeeping, so they are kept,
judged and folded with that forward. A step is judged again when its backward ends and after its
optimizer step (``on_backward_end``, ``on_optimizer_end``); its inputs stay kept until then.

CUDA graphs: hooks run while a graph is captured, so the graph records the statistics launches
with the model's kernels (levels blocks and modules; ops reads results on the host and refuses
to run under capture). Rows written by a graph are rewritten by each replay: once a graph was
captured, nothing is folded.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from math import isfinite
from typing import Any

import torch
from torch import nn

from ..kernels.stats import TensorStats
from ..model.placement import offloaded_value
from ..tree import local_shard
from .blocks import main_blocks
from .compiled_regions import (
    compiling,
    eager_named_modules,
    is_wrapper,
    outside_compile,
    root_outside_compile,
    unwrap,
)
from .floats import call_items, float_items, output_tensors
from .gradients import GradientHooks
from .listener import CallObserver, CaptureListener, Companion
from .ops import ModelSites, OpWatch
from .optimizer_step import OptimizerHooks
from .records import Call, Refs
from .sentinel import float_tensors_of, host_nonfinite, nonfinite_flag
from .sink import StatsSink
from .snapshot import Snapshot

LEVELS = ("sentinel", "blocks", "modules", "ops")
FOLD_BATCH = 32  # device sinks: forwards folded per read-back (one transfer for all of them)
_VERSION = operator.attrgetter("_version")
aminmax = torch.aminmax


@dataclass
class ModuleAggregate:
    """One module over the forwards folded away: enough for a headroom view, not for a report."""

    module: str
    module_type: str
    calls: int = 0
    absmax: float | None = None  # largest finite output value
    in_absmax: float | None = None
    nonfinite_calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


Raw = dict[int, tuple[list[int], list[float]]]  # row -> (ints, floats), as ``StatsSink.read`` gives them


def _nonfinite(raw: tuple[list[int], list[float]]) -> bool:
    i = raw[0]
    return bool(i[1] or i[2] or i[3])  # nan, posinf, neginf counts (stats.INT_FIELDS)


def _failed(calls: list[Call], rows: Raw | list[Any]) -> bool:
    """A forward failed when a module output is non-finite or its data held NaN/+inf (the rule of
    ``locate.producer.failed_inputs``, which capture does not import)."""
    for c in calls:
        if c.seq >= 0 and any(_nonfinite(rows[r]) for _, r in c.outputs):
            return True
        if c.parent is None and any(rows[r][0][1] or rows[r][0][2] for _, r in c.inputs):
            return True
    return False


def _phase_of(calls: list[Call], rows: Raw | list[Any]) -> str:
    """The first phase of a failing step with a non-finite output."""
    for phase in ("forward", "backward", "optimizer"):
        if any(
            c.phase == phase and c.seq >= 0 and any(_nonfinite(rows[r]) for _, r in c.outputs) for c in calls
        ):
            return phase
    return "forward"


def _modes_off(hook: Any) -> Any:
    """``hook`` run with the dispatch modes off (what it measures is not the model's ops)."""
    from torch.utils._python_dispatch import _disable_current_modes

    @functools.wraps(hook)
    def off(*args: Any) -> Any:
        with _disable_current_modes():
            return hook(*args)

    return off


class Recorder:
    """Capture per-module statistics while the model runs."""

    def __init__(
        self,
        model: nn.Module,
        level: str = "blocks",
        retain: int = 4,
        backend: str | None = None,
        device: Any = None,
        backward: bool = False,
        optimizer: Any = None,
        first_step: int = 0,
        listener: CaptureListener | None = None,
        underflow: bool = True,
        sample_every: int = 0,
        capture: bool = True,
        observers: list[CallObserver] | None = None,
    ):
        """``first_step``: the step number of the first root call (a re-run of step k records as
        step k); ``listener``: who is told of root calls, faults and optimizer steps; ``underflow``:
        abs-min and flush-to-zero counts on the CPU fast path too (``StatsSink``). ``level`` is one
        of ``LEVELS``, checked by whoever takes it from a user (``session.options.WatchOptions``).
        ``observers``: who sees every module call (``CallObserver``: a numerics trace); with
        ``capture=False`` the recorder only hooks the model for them (no statistics of its own)."""
        ddp = nn.parallel.DistributedDataParallel  # watch(DDP(m)): m's names (no "module."), no DDP re-runs
        model = model.module if isinstance(model, ddp) else model
        self._wrapper = model if is_wrapper(model) else None  # watch(torch.compile(m)): its root hooks
        self.model = model = unwrap(model)  # names, parameters and re-runs are the eager module's
        self.model = model = model.module if isinstance(model, ddp) else model  # torch.compile(DDP(m))
        self.opaque_forwards: set[int] = set()  # forwards that ran compiled: capture saw only the root
        self.level = level
        self.sentinel = level == "sentinel"  # root only; gradients, parameters judged by one reduction each
        self.sample_every = sample_every if self.sentinel else 0  # sentinel: blocks hooked every N-th step
        self._grad_flag: tuple[int, torch.Tensor] | None = (
            None  # sentinel on a device: read with the update's
        )
        self._sample_handles: list[Any] = []  # the blocks' hooks of the sampled step running now
        self._sample_targets: list[tuple[str, nn.Module]] | None = None  # the blocks a sampled step hooks
        self._lean = False  # the running root call took the sentinel's lean path
        self._lengths: dict[str, int] | None = None  # its KV caches' lengths, when its inputs are kept late
        self.sampled_steps = 0
        self._sampling: int | None = None  # the sampled step whose forward runs now
        self.samplers: list[Any] = []  # told of each sampled step (capture.signals.SampledSignals)
        self.latent: list[dict[str, Any]] = []  # sampled steps: {step, module} non-finite inside, finite out
        self.retain = retain
        self.window = max(1, retain)  # forwards kept in full besides the first failing one
        if device is None:
            # a placed model (--device-map auto) keeps offloaded parameters on meta: not a device;
            # a model with buffers only (a quantizer's scale) is where its buffers are
            p = next(
                (q for q in itertools.chain(model.parameters(), model.buffers()) if q.device.type != "meta"),
                None,
            )
            device = p.device if p is not None else torch.device("cpu")
        self.sink = StatsSink(device, backend, underflow=underflow)
        self._cuda = self.sink.device.type == "cuda"
        self.param_rows: dict[str, Refs] = {}  # latest rows of each module's own params
        self.param_row_at: dict[str, tuple[int, int, int]] = {}  # dotted name -> (row, version, block)
        self._own: dict[str, list[tuple[str, torch.Tensor]]] = {}
        self._own_src: dict[str, list[Any]] = {}  # per tensor of _own: its parameter (``_plain_sources``)
        self._after: dict[int, tuple[Any, int, int, int]] = {}  # id(param) -> (ref, version, row, step)
        # per hooked module: [its tensors with a version counter, their versions when measured, the
        # block of rows they were measured in, that block's users, the rows as Refs]
        self._pstate: dict[str, list[Any]] = {}
        self._handles: list[Any] = []
        self._n_hooked = 0
        self._stack: list[Call] = []
        self._count: dict[str, int] = {}
        self._seq = 0
        self._starts = 0
        self._forward = first_step - 1  # the latest root call's step (each is one input of the data set)
        self.listener = listener if listener is not None else CaptureListener()
        self._ops: OpWatch | None = None
        self.op_records: list[Any] = []  # level "ops": ops that introduced a non-finite value
        self._params_all = [p for p in model.parameters() if not p.is_inference()]
        self._named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._weights_at: dict[int, int] = {}  # forward -> weights_version() when it started
        # per forward, while it is kept in full
        self._detail: dict[int, list[Call]] = {}
        self._current: list[Call] = []  # the calls of the latest root call (its list in _detail)
        self._dirty: set[int] = set()  # host sink: steps that were given a non-finite row
        self._owned: dict[int, list[int]] = {}  # rows allocated for its calls' inputs and outputs
        self._owned_now: list[int] = []  # the latest root call's list in _owned
        self._host_hooks = False  # hooks measure straight into a host sink (no op-level mode): see attach
        self._param_use: dict[int, set[int]] = {}  # modules whose param rows its calls reference
        self._done: list[int] = []  # finished forwards, oldest first, not yet judged for folding
        self._inputs: dict[int, Snapshot] = {}
        self.first_failed: int | None = None
        self.aggregates: dict[str, ModuleAggregate] = {}
        self.forwards_folded = 0
        self._failed_runs: list[list[int]] = []  # [first, last] runs of failing forwards folded or judged
        self._param_blocks: dict[int, tuple[list[int], set[int], bool]] = {}  # id -> (rows, users, current)
        self._next_block = 0
        self._judged_upto = -1
        self._flags: list[tuple[int, Any, torch.Tensor]] = []  # device sinks: (forward, event, pinned flag)
        self._early: int | None = None  # forward whose flag said it failed, before it was judged
        self.paused = False  # a report's own re-runs are not recorded
        self.grads: GradientHooks | None = GradientHooks(self) if backward else None
        self.optimizer: OptimizerHooks | None = (
            OptimizerHooks(self, optimizer) if optimizer is not None else None
        )
        self.companions: list[
            Companion
        ] = []  # attached and detached with this recorder (serving.PackedBatches)
        # companions' ``inputs_left_out(kwargs)``: keywords a forward's kept inputs leave out
        self._left_out: list[Callable[[dict], Collection[str]]] = []
        # companions' root callbacks, called by the recorder's root hooks (only those they define)
        self._root_starts_of: list[Callable[[tuple, dict], None]] = []
        self._root_ends_of: list[Callable[[tuple, dict, Any], None]] = []
        # the last forward whose outputs the sentinel's one reduction found finite (companions'
        # post-hooks run after the recorder's and may skip their own check of those outputs)
        self.finite_outputs: int | None = None
        self.capturing = capture
        self.observers: list[CallObserver] = list(observers or [])
        self._observer_modes: list[Any] = []  # their dispatch modes, entered while attached
        self._observers_only = False  # paused for the capture, not for the observers (observers_only)
        self.rerun_steps: int | None = None  # an input's re-run for the observers: its first run's root calls
        self.sites = ModelSites()  # the model's source line of the running code, for observers

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        self.attach()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    def attach(self) -> None:
        if self._handles:
            return
        self._sample_targets = None  # found again: the model may have changed while detached
        targets: list[tuple[str, nn.Module]]
        for o in self.observers:
            o.attached(self)
        modes = [m for m in (o.op_mode() for o in self.observers) if m is not None]
        if not self.capturing:
            targets = []
        elif self.sentinel:
            targets = [("", self.model)]
        elif self.level == "blocks":
            blocks = set(main_blocks(self.model))
            targets = [(n, m) for n, m in eager_named_modules(self.model) if n == "" or n in blocks]
        else:
            targets = eager_named_modules(self.model)
        self._n_hooked = len(targets)
        if not targets and (self._root_starts_of or self._root_ends_of):
            targets = [("", self.model)]  # the companions' root callbacks: the recorder's own root hooks
        try:
            for name, m in targets:
                if name == "":  # the root runs eagerly even when called compiled (capture.compiled_regions)
                    m = self.root_hooked
                    pre, post = self._root_hooks(bool(modes))
                else:
                    pre, post = self._pre(name), self._post(name)
                    if modes:  # an observer's op mode sees the model's ops, not the statistics' own
                        pre, post = _modes_off(pre), _modes_off(post)
                self._handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
                self._handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True))
            if self.grads is not None:
                self.grads.attach(targets, self._grad_params)
            if self.optimizer is not None:
                self.optimizer.attach()
            if self.observers:
                self._observe(eager_named_modules(self.model))
        except BaseException:
            self.detach()
            raise
        if self.level == "ops" and self.capturing:
            self._ops = OpWatch(self)
            self._ops.__enter__()
        for m in modes:
            m.__enter__()
            self._observer_modes.append(m)
        self._host_hooks = self._ops is None and not self.sink._device_rows
        for c in self.companions:
            c.attach()

    def _observe(self, modules: list[tuple[str, nn.Module]]) -> None:
        """Hooks on every module for the observers (``CallObserver``), after the capture's own."""
        for name, m in modules:
            pre, post = self._observer_pre(name), self._observer_post(name)
            if name == "":
                m = self._wrapper if self._wrapper is not None else m
                pre, post = outside_compile(pre), outside_compile(post)
            self._handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True))

    def _observed(self) -> bool:
        return (not self.paused or self._observers_only) and not compiling()

    def _observer_pre(self, name: str):
        observers = self.observers

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if self._observed():
                for o in observers:
                    o.call_start(name, module, args, kwargs)

        return hook

    def _observer_post(self, name: str):
        observers = self.observers

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if self._observed():
                for o in observers:
                    o.call_end(name, module, args, kwargs, output)

        return hook

    @contextlib.contextmanager
    def observers_only(self) -> Iterator[None]:
        """Runs inside are seen by the observers only (a trace's ``--repeat`` re-runs): the capture
        is paused for them."""
        was = self.paused, self._observers_only
        self.paused, self._observers_only = True, True
        try:
            yield
        finally:
            self.paused, self._observers_only = was

    def input_run(self, index: int, run: Any, again: Any = None) -> Any:
        """``run()``: one input of a data set (what a mode runs for it), its root calls seen by the
        observers as input ``index``. An observer asking for N runs per input (a trace's
        ``--repeat N``) gets N-1 more of ``again`` (default ``run``) from the same RNG state, the
        capture paused for them (``observers_only``) and the RNG left as after the first run;
        ``rerun_steps`` is the first run's root calls while they run (a decoding stops there)."""
        if not self.observers:
            return run()
        n = max(o.repeats() for o in self.observers)
        with contextlib.ExitStack() as inside:
            for o in self.observers:
                inside.enter_context(o.input(index))
            state = torch.get_rng_state() if n > 1 else None
            before = self._forward
            with contextlib.ExitStack() as first:
                for o in self.observers:
                    first.enter_context(o.run(0))
                out = run()
            if n > 1:
                devices = (
                    [torch.cuda.current_device()]
                    if torch.cuda.is_available() and torch.cuda.is_initialized()
                    else []
                )
                self.rerun_steps = self._forward - before
                try:
                    with torch.random.fork_rng(devices=devices):
                        for r in range(1, n):
                            assert state is not None  # taken above whenever n > 1
                            torch.set_rng_state(state)  # every re-run draws the same random numbers
                            with contextlib.ExitStack() as later, self.observers_only():
                                for o in self.observers:
                                    later.enter_context(o.run(r))
                                (again or run)()
                finally:
                    self.rerun_steps = None
        return out

    def source_site(self, skip: int = 1) -> tuple[str, int] | None:
        """(file, line) of the model's own code that runs now (``capture.ops.ModelSites``)."""
        return self.sites.site(skip + 1)

    @property
    def root_hooked(self) -> nn.Module:
        """The module whose hooks are the root's: the compiled wrapper when the watch was given one
        (its hooks run around the compiled call), else the eager model (capture.compiled_regions)."""
        return self._wrapper if self._wrapper is not None else self.model

    def add_observer(self, observer: CallObserver) -> None:
        """One more observer of every module call (``CallObserver``), before ``attach``."""
        if self._handles:
            raise RuntimeError("an observer is added before the recorder is attached")
        self.observers.append(observer)

    def add_companion(self, companion: Companion) -> None:
        """A ``Companion`` that watches the same model for as long as this recorder does (a watch's
        ``serving.PackedBatches``), its root callbacks called from the recorder's root hooks;
        attached now if this recorder is (before ``attach``: the root hooks exist only once a
        recorder that captures nothing has a companion with root callbacks)."""
        self.companions.append(companion)
        if companion.overrides("inputs_left_out"):
            self._left_out.append(companion.inputs_left_out)
        if companion.overrides("root_start"):
            self._root_starts_of.append(companion.root_start)
        if companion.overrides("root_end"):
            self._root_ends_of.append(companion.root_end)
        if self._handles:
            companion.attach()

    def detach(self) -> None:
        for c in self.companions:
            c.detach()
        while self._observer_modes:
            self._observer_modes.pop().__exit__(None, None, None)
        if self._ops is not None:
            ops, self._ops = self._ops, None
            ops.__exit__(None, None, None)
            self.op_records = ops.records
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._end_sample()
        if self.grads is not None:
            self.grads.detach()
        if self.optimizer is not None:
            self.optimizer.detach()
        self._stack.clear()
        for o in self.observers:
            o.detached()

    # -- what is kept -----------------------------------------------------------------------
    @property
    def calls(self) -> list[Call]:
        """The calls kept in full (the first failing forward's and the latest ones), in order."""
        return [c for f in sorted(self._detail) for c in self._detail[f]]

    @property
    def retained(self) -> list[tuple[int, Snapshot]]:
        """(forward, input snapshot) of the forwards whose inputs are kept."""
        return sorted(self._inputs.items(), key=lambda kv: kv[0])

    def inputs_of(self, forward: int) -> Snapshot | None:
        return self._inputs.get(forward)

    def renumber_steps(self, indices: list[int]) -> None:
        """After recording a part of a data set: each kept call's step (the local root-call
        number) becomes ``indices[step]``, its data-set index. Nothing is judged after this."""
        for c in self.calls:
            c.input_index = indices[c.input_index]

    # -- the public API of collaborators (gradients, optimizer steps, sessions) ---------------
    @property
    def current_step(self) -> int:
        """The step of the latest root call (-1 before any, or ``first_step - 1``)."""
        return self._forward

    def calls_of(self, step: int) -> list[Call] | None:
        """The calls of ``step`` while it is kept in full (None once folded away)."""
        return self._detail.get(step)

    def measure(
        self, items: list[tuple[str, torch.Tensor]], owned: bool = True, step: int | None = None
    ) -> Refs:
        """Measure (label, tensor) pairs in one batch: their stats rows. ``owned``: the rows belong
        to ``step`` (default: the current one) and are given back when it is folded away."""
        return self._measure_flat(items, owned=owned, forward=step)

    def rows_on_host(self) -> bool:
        """Whether reading a step's rows costs nothing (a host sink: no device to wait for)."""
        return self._rows_on_host()

    def judge_finished(self, upto: int) -> None:
        """Judge every finished step up to ``upto`` now (one read-back on a device sink)."""
        self._judge([f for f in self._done if f <= upto])

    def judge_flagged(self) -> None:
        """Device sink: read the pending flags and judge every finished forward up to the first
        flagged one (one read-back), so ``first_failed`` is set when a forward failed."""
        self.poll_flags(wait=True)
        if self.first_failed is None and self._early is not None:
            self.judge_finished(self._early)

    def grads_needed(self, step: int) -> bool:
        """Whether the gradients that reached the root outputs in ``step`` must stay kept."""
        return self.listener.grads_needed(step, self.first_failed)

    def on_optimizer_start(self, step: int, hooks: OptimizerHooks) -> None:
        """Before ``optimizer.step()`` of a kept step."""
        self.listener.on_optimizer_start(step, hooks)

    @property
    def late_phases(self) -> bool:
        """Whether steps have phases after their forward (backward, optimizer)."""
        return self.grads is not None or self.optimizer is not None

    def next_start(self) -> int:
        self._starts += 1
        return self._starts - 1

    def _measure_all(self, *parts: tuple[Any, str]) -> Refs:
        """Measure the float tensors inside each (object, label prefix) in one batch."""
        return self._measure_items([item for obj, prefix in parts for item in float_items(obj, prefix)])

    def _measure_hook(self, items: list[tuple[str, torch.Tensor]]) -> Refs:
        """``_measure_items`` for a hook of the current step: straight into a host sink when no
        op-level mode is on (what every watched forward runs, in one call instead of four)."""
        sink = self.sink
        if self._ops is not None or sink._device_rows:
            return self._measure_items(items)
        refs = sink.measure_host(items, True, self._owned_now)
        if sink.bad_rows:
            self._mark_dirty(refs)
        return refs

    def _mark_dirty(self, refs: Refs) -> None:
        bad = self.sink.bad_rows
        if any(r in bad for _, r in refs):
            self._dirty.add(self._forward)  # a non-finite row: this step is judged by reading its rows

    def _measure_items(self, items: list[tuple[str, torch.Tensor]]) -> Refs:
        if self._ops is not None:  # the stats' own ops must not be seen by the op-level mode
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():
                return self._measure_flat(items)
        return self._measure_flat(items)

    def _measure_flat(
        self,
        items: list[tuple[str, torch.Tensor]],
        owned: bool = True,
        forward: int | None = None,
        new_rows: list[int] | None = None,
    ) -> Refs:
        """``owned``: the new rows go to the step's ``_owned`` list (given back when it is folded);
        else to ``new_rows``, when given."""
        if not items:
            return []
        sink = self.sink
        f = self._forward if forward is None else forward
        if owned:
            new_rows = self._owned.get(f)
            if new_rows is None:
                new_rows = self._owned[f] = []
        refs = sink.measure_labelled(items, cache=owned, new_rows=new_rows)
        bad = sink.bad_rows
        if bad and any(r in bad for _, r in refs):
            self._dirty.add(f)  # a non-finite row: this step is judged by reading its rows
        return refs

    def _pre(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if self.paused or compiling():  # inside a compiled region: see capture.compiled_regions
                return
            stack = self._stack
            if not stack:  # a root call: one input of the data set
                # a sampled sentinel step keeps its KV cache's lengths, its inputs taken if it fails
                self._root_starts(args, kwargs, keep=self._lengths is None)
                # steps N-1, 2N-1...: a watch around one forward (or fewer than N) samples none
                if (
                    self.sample_every
                    and self._forward % self.sample_every == self.sample_every - 1
                    and not compiling()
                ):
                    self._start_sample()
            count = self._count
            idx = count.get(name, 0)
            count[name] = idx + 1
            items = call_items(args, kwargs)
            if not items:
                inputs = []
            elif self._host_hooks:  # straight into the host sink (``_measure_hook``), one call less
                inputs = self.sink.measure_host(items, True, self._owned_now)
                if self.sink.bad_rows:
                    self._mark_dirty(inputs)
            else:
                inputs = self._measure_hook(items)
            call = Call(
                self._starts,
                name,
                type(module).__name__,
                idx,
                len(stack),
                stack[-1].start if stack else None,
                self._forward,
                inputs,
                [],
                self._params(name, module),
            )
            self._starts += 1
            self._current.append(call)
            stack.append(call)
            if self.grads is not None:
                self.grads.on_inputs(call, items, module)

        return hook

    def _lean_root(self) -> bool:
        """Whether the root's finite steps take the sentinel's lean path: no grad capture, a host
        sink, no op-level mode (a device sink keeps its flags: no read-back per forward)."""
        return self.sentinel and self.grads is None and not self.sink._device_rows

    def _root_hooks(self, modes: bool) -> tuple[Callable[..., None], Callable[..., None]]:
        """The root's one pre-hook and one post-hook: the recorder's part of a root call, then its
        companions' (``Companion.root_start``/``root_end``), in one hook call each; marked to run
        eagerly around a compiled call at no cost per call (``root_outside_compile``: these ``def``s
        hook nothing but the root). The sentinel's lean path is its own pair (``_lean_pre``)."""
        starts, ends = self._root_starts_of, self._root_ends_of
        if self.capturing and self._lean_root() and not modes:
            pre, post = self._lean_pre(self._pre("")), self._lean_post(self._post(""))
            return root_outside_compile(pre), root_outside_compile(post)
        own_pre: Callable[..., None] | None = None
        own_post: Callable[..., None] | None = None
        if self.capturing:
            own_pre, own_post = self._pre(""), self._post("")
            if self._lean_root():
                own_pre, own_post = self._lean_pre(own_pre, False), self._lean_post(own_post, False)
            if modes:  # an observer's op mode sees the model's ops, not the statistics' own
                own_pre, own_post = _modes_off(own_pre), _modes_off(own_post)

        def root_pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if own_pre is not None:
                own_pre(module, args, kwargs)
            for c in starts:
                c(args, kwargs)

        def root_post(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if own_post is not None:
                own_post(module, args, kwargs, output)
            for c in ends:
                c(args, kwargs, output)

        return root_outside_compile(root_pre), root_outside_compile(root_post)

    def _lean_pre(self, full: Any, companions: bool = True) -> Callable[..., None]:
        """The sentinel's root pre-hook: a step starts — its number, the weights' version, its one
        root ``Call`` and what a replay needs (its inputs, or its KV caches' lengths when the inputs
        are taken only if it fails; the ambient context, through the listener) — then the
        companions' ``root_start``. No statistics. A sampled step, or a root called inside itself,
        takes the full path (``full``). Written as one function: it runs on every step (the fixed
        cost per watched forward, benchmarks/2026-11-29-fixed-cost.md)."""
        starts = self._root_starts_of if companions else []
        keeps = self.listener.keeps_inputs()  # a listener's answer for the whole recording
        root_type = type(self.model).__name__
        params = self._params_all
        lengths_of = Snapshot.cache_lengths
        # an optimizer step may follow (and change the weights) before the step is judged; a forward
        # alone changes no parameter, so its version at the end is the one it ran with
        later = self.optimizer is not None

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not (self.paused or compiling()):
                n = self.sample_every
                if self._stack:  # the root called inside itself
                    self._lean = False
                    full(module, args, kwargs)
                elif n and (self._forward + 1) % n == n - 1:  # a sampled step: in full, inputs taken late
                    self._lean = False
                    self._lengths = lengths_of(args, kwargs) if keeps else None
                    full(module, args, kwargs)
                else:
                    self._lean = True
                    # a decode step's KV cache is snapshotted only if the step fails (Snapshot.cropped)
                    lengths = self._lengths = lengths_of(args, kwargs) if keeps else None
                    self._forward = f = self._forward + 1
                    if later:  # the weights' version now; a step without later phases takes it if it fails
                        self._weights_at[f] = sum(map(_VERSION, params))  # weights_version()
                    call = Call(self._starts, "", root_type, 0, 0, None, f)
                    self._starts += 1
                    self._current = self._detail[f] = [call]
                    self._stack.append(call)
                    if keeps and lengths is None:
                        left_out = self._left_out
                        without = [k for lo in left_out for k in lo(kwargs)] if left_out else ()
                        self._inputs[f] = Snapshot.of(args, kwargs, without)
                        self._drop_old_inputs()
                    self.listener.on_root_call(f)
            for c in starts:
                c(args, kwargs)

        return hook

    def _lean_post(self, full: Any, companions: bool = True) -> Callable[..., None]:
        """The sentinel's root post-hook: one reduction over the outputs and one read; the step is
        judged and the forwards past the window folded (``_finish``), then the companions'
        ``root_end``. Only a forward whose outputs went non-finite is measured (inputs, outputs,
        every parameter), so the producer rule and ``report()`` see it as a full capture of the
        root would."""
        ends = self._root_ends_of if companions else []

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if not self._lean:
                full(module, args, kwargs, output)
            elif self._stack and not (self.paused or compiling()):
                del self._stack[:]  # the root's own call (nothing inside it is hooked)
                call = self._current[0]
                call.seq = self._seq
                self._seq += 1
                f = call.input_index
                tensors = output_tensors(output)
                if len(tensors) == 1:  # host_nonfinite's one-tensor case, inline: one aminmax, two reads
                    t = tensors[0]
                    if t.numel():
                        lo, hi = aminmax(t)
                        bad = not (isfinite(lo.item()) and isfinite(hi.item()))
                    else:
                        bad = False
                else:
                    bad = bool(tensors) and host_nonfinite(tensors)
                if bad:
                    self._weights_at.setdefault(f, self.weights_version())
                    self._measure_failing_root(call, args, kwargs, float_items(output))
                    if self._lengths is not None:
                        self._inputs[f] = Snapshot.cropped(args, kwargs, self._lengths)
                else:
                    self.finite_outputs = f
                if self._wrapper is not None:
                    self.opaque_forwards.add(f)  # ran compiled: nothing inside was seen
                self._finish_on_host(f)  # a lean root has a host sink (_lean_root)
                if self.opaque_forwards:
                    self.opaque_forwards.intersection_update(self._detail)
            for c in ends:
                c(args, kwargs, output)

        return hook

    def _measure_failing_root(
        self, call: Call, args: tuple, kwargs: dict, items: list[tuple[str, torch.Tensor]]
    ) -> None:
        """Sentinel, outputs non-finite: the root call's inputs, outputs and every parameter and
        buffer of the model (as the forward used them) measured into the step's rows."""
        self.sink.forget_tensors()  # the lean path leaves the identity cache of an earlier step
        self._owned_now = self._owned.setdefault(call.input_index, [])
        call.inputs = self._measure_hook(call_items(args, kwargs))
        call.outputs = self._measure_hook(items)
        named = list(self.model.named_parameters()) + list(self.model.named_buffers())
        own = [
            (n, local_shard(p.detach()))
            for n, p in named
            if p is not None and p.is_floating_point() and p.device.type != "meta"
        ]
        call.params = self._measure_hook(own)

    def _start_sample(self) -> None:
        """Sentinel, a sampled step: the blocks are hooked for this root call only (removed when it
        ends), so the step is recorded at level "blocks" (statistics, aggregates, latent faults)."""
        if self._sample_targets is None:  # the model's blocks, found once per attach
            blocks = set(main_blocks(self.model))
            self._sample_targets = [(n, m) for n, m in eager_named_modules(self.model) if n in blocks]
        for name, m in self._sample_targets:
            pre, post = self._pre(name), self._post(name)
            if self._observer_modes:
                pre, post = _modes_off(pre), _modes_off(post)
            self._sample_handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            self._sample_handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True))
        self.sampled_steps += 1
        self._sampling = self._forward
        for s in self.samplers:
            s.sample_start(self._forward)

    def _sample_done(self, f: int, output: Any) -> None:
        """A sampled step's root forward ended: its modules' output absmax, from this step's rows, and
        its outputs go to the samplers (``capture.signals``); only sampled steps read rows here."""
        self._sampling = None
        if not self.samplers:
            return
        calls = [c for c in self._detail.get(f, ()) if c.phase == "forward" and c.outputs]
        rows = self._rows_of([f])
        top: dict[str, float] = {}
        for c in calls:
            for _, r in c.outputs:
                a = rows[r][1][0]  # absmax (stats.FLOAT_FIELDS[0]); NaN when not computed
                if a == a and a != float("inf") and a > top.get(c.module, -1.0):
                    top[c.module] = a
        for s in self.samplers:
            s.sample_end(f, list(top.items()), output)

    def _end_sample(self) -> None:
        for h in self._sample_handles:
            h.remove()
        self._sample_handles.clear()

    def _root_starts(self, args: tuple, kwargs: dict, keep: bool = True) -> None:
        """Per-forward bookkeeping at a root call: a new step, its records, its inputs kept (unless
        ``keep`` is False: the sentinel's lean path keeps them at the end, for a failing step only)."""
        capturing = self._cuda and torch.cuda.is_current_stream_capturing()
        if self._ops is not None and capturing:
            raise RuntimeError(
                "nan_hunter.watch(level='ops') reads every op's result on the host and cannot "
                "run inside CUDA-graph capture; capture with level='blocks' or 'modules' "
                "(report() re-runs the failing input at op level, outside the graph)"
            )
        if self._flags and not capturing:
            self.poll_flags()
        self._forward = f = self._forward + 1
        self._count.clear()
        self.sink.forget_tensors()
        self._weights_at[f] = self.weights_version()
        self._current = self._detail[f] = []
        self._owned_now = self._owned[f] = []
        if keep and self.listener.keeps_inputs():
            without = [k for left_out in self._left_out for k in left_out(kwargs)] if self._left_out else ()
            self._inputs[f] = Snapshot.of(args, kwargs, without)
            self._drop_old_inputs()
        self.listener.on_root_call(f)

    def _param_tensors(self, name: str, module: nn.Module) -> list[tuple[str, torch.Tensor]]:
        """The floating parameters and buffers a call is judged against: the module's own, or at
        level "blocks" everything under it that no other hooked module owns."""
        if self.level == "blocks":
            blocks = set(main_blocks(self.model)) if name == "" else set()
            named = [
                (n, p)
                for n, p in list(module.named_parameters()) + list(module.named_buffers())
                if not any(n.startswith(b + ".") for b in blocks)
            ]
        else:
            named = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        named = [(pn, p) for pn, p in named if p is not None and p.is_floating_point()]
        if any(p.device.type == "meta" for _, p in named):  # offloaded by accelerate (--device-map auto)
            named = [
                (pn, offloaded_value(module, pn, p) if p.device.type == "meta" else p) for pn, p in named
            ]
            named = [(pn, p) for pn, p in named if p is not None]  # no value to read: noted by prepare
        # a DTensor parameter (FSDP2, tensor parallel) is measured on this rank's shard: no collective
        return [(pn, local_shard(p.detach())) for pn, p in named]

    def _plain_sources(self, name: str, module: nn.Module, own: list[tuple[str, torch.Tensor]]) -> list[Any]:
        """Per tensor of ``own``: the parameter it is a detached view of, when it is one whose rows
        an optimizer step measured may stand for it (plain tensors only); None otherwise."""
        if self.optimizer is None:
            return [None] * len(own)
        params = dict(module.named_parameters())
        out = []
        for pn, t in own:
            p = params.get(pn)
            plain = p is not None and type(p) in (torch.Tensor, nn.Parameter) and type(t) is torch.Tensor
            out.append(
                p if p is not None and plain and t.data_ptr() == p.data_ptr() and t.shape == p.shape else None
            )
        return out

    def _params(self, name: str, module: nn.Module) -> Refs:
        """Rows of the call's parameters and buffers: measured at the module's first call, and
        again whenever one changed in place since (an optimizer step between forwards of one
        capture), so every call is judged against the weights it actually used. The sentinel
        judges parameters after each optimizer step instead: none per call."""
        if self.sentinel:
            return []
        st = self._pstate.get(name)
        if st is None:
            own = self._own[name] = self._param_tensors(name, module)
            self._own_src[name] = self._plain_sources(name, module, own)
            st = self._pstate[name] = [[p for _, p in own if not p.is_inference()], None, -1, set(), []]
        versions = tuple(map(_VERSION, st[0]))
        if versions != st[1]:
            self._measure_params(name, st, versions)
        users = st[3]
        f = self._forward
        if f not in users:
            users.add(f)
            use = self._param_use.get(f)
            if use is None:
                self._param_use[f] = {st[2]}
            else:
                use.add(st[2])
        return st[4]

    def _measure_params(self, name: str, st: list[Any], versions: tuple[int, ...]) -> None:
        """Measure a module's parameters and buffers into a new block of rows (``_params``); the
        block of the values they had before is given back once no kept step uses it."""
        old = st[2]
        if old >= 0:
            rows, users, _ = self._param_blocks[old]
            self._param_blocks[old] = (rows, users, False)
            self._release_params(old)
        own = self._own[name]
        new_rows: list[int] = []
        bid = self._next_block
        self._next_block += 1
        users = set()
        taken = self._take_after_rows(own, self._own_src[name], bid, users) if self._after else {}
        if taken:
            fresh = iter(self._measure_all_params([x for i, x in enumerate(own) if i not in taken], new_rows))
            refs = [(pn, taken[i]) if i in taken else next(fresh) for i, (pn, _) in enumerate(own)]
            new_rows += taken.values()
        else:
            refs = self._measure_all_params(own, new_rows)
        self.param_rows[name] = refs
        self._param_blocks[bid] = (new_rows, users, True)
        st[1:] = [versions, bid, users, refs]
        for (pn, t), (_, r) in zip(own, refs):
            self.param_row_at[f"{name}.{pn}" if name else pn] = (r, t._version, bid)

    def measured_after_step(self, params: list[torch.Tensor], refs: Refs, step: int) -> None:
        """An optimizer step of ``step`` measured ``params`` after the update into ``refs`` (rows
        ``step`` owns): the next forward's parameter rows take them over while the parameters are
        unchanged (``_take_after_rows``), instead of reading every parameter again."""
        after = self._after
        after.clear()
        for p, (_, r) in zip(params, refs):
            try:
                after[id(p)] = (weakref.ref(p), p._version, r, step)
            except (TypeError, RuntimeError):  # no weakref, no version counter: measured again
                continue

    def _take_after_rows(
        self, own: list[tuple[str, torch.Tensor]], src: list[Any], bid: int, users: set[int]
    ) -> dict[int, int]:
        """Index in ``own`` -> row, for each parameter the latest optimizer step measured and left
        unchanged since (the same values, so the same row): the row moves from the step's rows to
        the block ``bid`` of parameter rows, which that step then uses too (kept while either is)."""
        taken: dict[int, int] = {}
        after = self._after
        for i, ((_, t), p) in enumerate(zip(own, src)):
            hit = after.get(id(p)) if p is not None else None
            if hit is None or hit[0]() is not p or hit[1] != t._version or hit[3] not in self._owned:
                continue
            del after[id(p)]
            taken[i] = hit[2]
            users.add(hit[3])
        if taken:
            moved = set(taken.values())
            for step in users:
                self._param_use.setdefault(step, set()).add(bid)
                owned = self._owned[step]
                owned[:] = [r for r in owned if r not in moved]
            bad = self.sink.bad_rows
            if bad and not moved.isdisjoint(bad):
                self._dirty.add(self._forward)  # as measuring them would have
        return taken

    def param_row(self, name: str, p: torch.Tensor, forward: int) -> int | None:
        """The row forward ``forward`` measured parameter ``name`` in, if it is unchanged since."""
        hit = self.param_row_at.get(name)
        if (
            hit is None
            or p.is_inference()
            or hit[1] != p._version
            or hit[2] not in self._param_use.get(forward, ())
        ):
            return None
        return hit[0]

    def _grad_params(self, name: str, module: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """The parameters whose gradients belong to a call's backward (as ``_param_tensors``); none
        for the sentinel, which judges them all at once when the backward pass ends."""
        if self.sentinel:
            return []
        if self.level == "blocks":
            blocks = set(main_blocks(self.model)) if name == "" else set()
            named = [
                (n, p) for n, p in module.named_parameters() if not any(n.startswith(b + ".") for b in blocks)
            ]
        else:
            named = list(module.named_parameters(recurse=False))
        return [(n, p) for n, p in named if p.is_floating_point()]

    def _measure_all_params(self, own: list[tuple[str, torch.Tensor]], new_rows: list[int]) -> Refs:
        if self._ops is not None:
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():
                return self._measure_flat(own, owned=False, new_rows=new_rows)
        return self._measure_flat(own, owned=False, new_rows=new_rows)

    def _release_params(self, bid: int) -> None:
        rows, users, current = self._param_blocks[bid]
        if not users and not current:
            del self._param_blocks[bid]
            self.sink.free(rows)

    def _post(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            stack = self._stack
            if not stack or self.paused or compiling():
                return
            if stack[-1].module != name:
                if not any(c.module == name for c in stack):
                    return
                while stack[-1].module != name:
                    stack.pop()  # calls whose post-hook a compiled region swallowed: left unfinished
            call = stack.pop()
            call.seq = self._seq
            self._seq += 1
            items = float_items(output)
            if items:
                if self._host_hooks:
                    call.outputs = self.sink.measure_host(items, True, self._owned_now)
                    if self.sink.bad_rows:
                        self._mark_dirty(call.outputs)
                else:
                    call.outputs = self._measure_hook(items)
            if self.grads is not None:
                self.grads.on_outputs(call, items)
            if self._ops is not None:
                from torch.utils._python_dispatch import _disable_current_modes

                with _disable_current_modes():
                    self._ops.module_done(call, module, args, kwargs, output)
            if not stack:
                f = call.input_index
                if self._lengths is not None:  # a sampled sentinel step: its inputs now, if it failed
                    if f in self._dirty:
                        self._inputs[f] = Snapshot.cropped(args, kwargs, self._lengths)
                    self._lengths = None
                sampled = bool(self._sample_handles)
                if sampled:
                    self._end_sample()
                if self._sampling == f:
                    self._sample_done(f, output)
                inside = self._n_hooked > 1 or sampled or (self.sentinel and self._wrapper is not None)
                if inside and len(self._detail.get(f, ())) == 1:
                    self.opaque_forwards.add(f)  # ran compiled: nothing inside was seen
                self._finish(f)
                if self.opaque_forwards:
                    self.opaque_forwards.intersection_update(self._detail)  # only forwards still kept

        return hook

    # -- folding ----------------------------------------------------------------------------
    def _drop_old_inputs(self) -> None:
        """Inputs are kept for the latest ``window`` forwards not yet judged (a device sink judges
        in batches) and for the first failing forward: a snapshot may hold a KV cache's tensors."""
        if len(self._inputs) <= self.window:
            return  # nothing to drop (a host sink without later phases keeps only the running forward's)
        unjudged = [f for f in self._inputs if f not in (self.first_failed, self._early)]
        old = unjudged[: max(0, len(unjudged) - self.window)]
        if old and self._flags and self._flags[0][0] <= old[-1]:
            self.poll_flags(upto=old[-1])  # the device is that far behind: wait for those flags
        for f in old:
            if f != self._early:
                del self._inputs[f]

    def _flag(self, forward: int) -> None:
        """Device sink: whether ``forward`` failed, computed on the device and copied to pinned
        host memory without a synchronisation; ``poll_flags`` reads it once it is there."""
        calls = self._detail.get(forward, [])
        outs = [r for c in calls for _, r in c.outputs]
        data = [r for c in calls if c.parent is None for _, r in c.inputs]
        flag = self.sink.flag_nonfinite(outs, data)
        host = torch.empty((), dtype=torch.bool, pin_memory=self.sink.device.type == "cuda")
        host.copy_(flag, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._flags.append((forward, event, host))

    def poll_flags(self, wait: bool = False, upto: int = -1) -> None:
        """Read the device flags that are ready (all of them with ``wait``, those of forwards up to
        ``upto`` in any case): the first forward flagged as failing gets its inputs copied
        (``Snapshot.pin``) before later forwards can change them or push them out."""
        while self._flags:
            forward, event, host = self._flags[0]
            if not wait and forward > upto and not event.query():
                return
            event.synchronize()
            self._flags.pop(0)
            if bool(host) and self.first_failed is None and self._early is None:
                snap = self._inputs.get(forward)
                if snap is not None:
                    snap.pin()
                    self._early = forward
                self._flags.clear()

    def _rows_on_host(self) -> bool:
        """Whether reading a forward's rows costs nothing (no device to wait for)."""
        return self.sink.device.type == "cpu"

    def _foldable(self) -> bool:
        return not self.sink.graph_rows

    def _finish(self, forward: int) -> None:
        """A root forward ended: judge it now when its rows are in host memory (cheap), else start
        a flag that is read once the device has computed it; fold the forwards that left the
        window (in batches on a device sink: one read-back for all of them)."""
        if self.sink.graph_rows:  # rows a CUDA graph rewrites on each replay: judged when read
            self._done.append(forward)
            self.listener.on_forward_end(forward)
            return
        if self._rows_on_host():
            self._finish_on_host(forward)
            return
        done = self._done
        done.append(forward)
        if self.first_failed is None and self._early is None and forward in self._inputs:
            self._flag(forward)
        if len(done) >= self.window + FOLD_BATCH:
            self._fold_done()
        self.listener.on_forward_end(forward)  # a host sink's forward was judged: nothing to read

    def _finish_on_host(self, forward: int) -> None:
        """``_finish`` of a forward whose rows are in host memory (the sentinel's lean path calls
        it directly): judged now, its inputs dropped unless it failed or later phases follow;
        folded in batches of FOLD_BATCH at the sentinel (a fold's fixed part spread over
        forwards of one call each), else one by one."""
        done = self._done
        done.append(forward)
        if forward > self._judged_upto and not self.sink._device_rows and forward not in self._dirty:
            self._judged_upto = forward  # the root-forward fast path: no row of it counts a NaN or ±inf
        else:
            self._judge([forward])
        if self.first_failed != forward and self.grads is None and self.optimizer is None:
            self._inputs.pop(forward, None)  # a report only re-runs the first failing forward
        if len(done) >= self.window + (FOLD_BATCH if self.sink._device_rows or self.sentinel else 1):
            self._fold_done()

    def _fold_done(self) -> None:
        """Fold the finished forwards that left the window."""
        done = self._done
        old = done[: len(done) - self.window]
        self._done = done[len(old) :]
        self._fold(old)

    def _row_refs(self, forwards: list[int]) -> list[int]:
        return [
            r
            for f in forwards
            for c in self._detail.get(f, ())
            for refs in (c.inputs, c.outputs, c.params)
            for _, r in refs
        ]

    def _rows_of(self, forwards: list[int]) -> Raw | list:
        """The rows of ``forwards``, indexable by row: a host sink's own table (nothing copied),
        else one read-back of just those rows."""
        table = self.sink.host_table()
        return table if table is not None else self.sink.read(self._row_refs(forwards))

    def _clean(self, forwards: list[int]) -> bool:
        """A host sink knows which rows count a NaN or ±inf as it writes them: forwards none of
        whose steps was given such a row are finite, judged without reading a row."""
        return not self.sink._device_rows and not any(f in self._dirty for f in forwards)

    def _judge(self, forwards: list[int], rows: Raw | list | None = None) -> None:
        """Whether each forward failed (a non-finite module output, or NaN/+inf data), recording the
        first failing one, whose calls, rows and inputs are then kept whatever comes after.
        Forwards are judged once, in order."""
        forwards = [f for f in forwards if f > self._judged_upto]
        if not forwards:
            return
        if self._clean(forwards):
            self._judged_upto = forwards[-1]
            return
        rows = rows if rows is not None else self._rows_of(forwards)
        for f in forwards:
            self._judged_upto = f
            calls = self._detail.get(f, [])
            if self.sentinel and not _failed([c for c in calls if c.parent is None], rows):
                self._note_latent(f, calls, rows)
                continue
            if not _failed(calls, rows):
                continue
            phase = _phase_of(self._detail.get(f, []), rows)
            if phase != "forward" and not self.listener.accept_fault(f, phase):
                continue
            if self._failed_runs and self._failed_runs[-1][1] == f - 1:
                self._failed_runs[-1][1] = f
            else:
                self._failed_runs.append([f, f])
            if self.first_failed is None:
                self.first_failed = f
                snap = self._inputs.get(f)
                if snap is not None:
                    snap.pin()  # a copy later forwards cannot change
                self.listener.on_first_fault(f, phase)

    def _note_latent(self, f: int, calls: list[Call], rows: Raw | list) -> None:
        """Sentinel, a step whose root outputs are finite: a non-finite block output (a sampled
        step) was masked before the outputs. It is latent, not a fault: noted, and its calls
        inside the root are dropped so that no later judge of the recording takes it for one."""
        bad = [
            c
            for c in calls
            if c.parent is not None
            and c.phase == "forward"
            and c.seq >= 0
            and any(_nonfinite(rows[r]) for _, r in c.outputs)
        ]
        if not bad:
            return
        first = min(bad, key=lambda c: c.seq)
        self.latent.append({"step": f, "module": first.module})
        calls[:] = [c for c in calls if c.parent is None or c.phase != "forward"]

    def _fold(self, forwards: list[int]) -> None:
        """Fold forwards into the per-module aggregates and give their rows back, except the first
        failing forward, kept in full."""
        rows = self._rows_of(forwards)
        self._judge(forwards, rows)
        if self._flags:
            self._flags = [x for x in self._flags if x[0] > self._judged_upto]
        if self._early is not None and self._early != self.first_failed and self._early <= self._judged_upto:
            self._early = None
        aggregates = self.aggregates
        blocks = self._param_blocks
        for f in forwards:
            if f == self.first_failed:
                continue
            calls = self._detail.pop(f, [])
            if self.grads is not None:
                self.grads.forget(f)
            if len(calls) == 1 and f not in self._owned and not calls[0].outputs and not calls[0].inputs:
                c = calls[0]  # the sentinel's lean step: one root call, no row of its own
                agg = aggregates.get(c.module)
                if agg is None:
                    agg = aggregates[c.module] = ModuleAggregate(c.module, c.module_type)
                agg.calls += 1
                self._inputs.pop(f, None)
                self._weights_at.pop(f, None)
                self.forwards_folded += 1
                self.listener.on_forget(f)
                continue
            for c in calls:
                if c.phase != "forward":
                    continue
                agg = aggregates.get(c.module)
                if agg is None:
                    agg = aggregates[c.module] = ModuleAggregate(c.module, c.module_type)
                agg.calls += 1
                top = agg.absmax
                bad = False
                for _, r in c.outputs:
                    ints, floats = rows[r]
                    a = floats[0]  # absmax (stats.FLOAT_FIELDS[0]); NaN when not computed
                    if a == a and (top is None or a > top):
                        top = a
                    if ints[1] or ints[2] or ints[3]:  # nan, posinf, neginf
                        bad = True
                agg.absmax = top
                if c.inputs:
                    top = agg.in_absmax
                    for _, r in c.inputs:
                        a = rows[r][1][0]
                        if a == a and (top is None or a > top):
                            top = a
                    agg.in_absmax = top
                if bad:
                    agg.nonfinite_calls += 1
            self.sink.free(self._owned.pop(f, []))
            for bid in self._param_use.pop(f, ()):
                block = blocks.get(bid)
                if block is not None:
                    users = block[1]
                    users.discard(f)
                    if not users and not block[2]:  # _release_params
                        del blocks[bid]
                        self.sink.free(block[0])
            self._inputs.pop(f, None)
            self._weights_at.pop(f, None)
            self._dirty.discard(f)
            self.forwards_folded += 1
            self.listener.on_forget(f)

    # -- later phases -------------------------------------------------------------------------
    def on_backward_end(self, forwards: list[int]) -> None:
        """A backward pass ended: on a host sink, judge the steps it went through now (while the
        weights are still those of the step). A device sink judges them when folded or reported,
        unless ``_judge_late_now`` asks for it now (one read-back per backward pass). The sentinel
        judges every gradient here, by one reduction (``_sentinel_backward``)."""
        if self.sentinel and forwards:
            self._sentinel_backward(forwards)
        if not self._rows_on_host() and not self.listener.judge_late_now():
            return
        self.judge_backward(forwards)

    def _sentinel_backward(self, forwards: list[int]) -> None:
        """Sentinel: the gradients of every parameter, judged by one fused reduction and one read.
        Only when one is non-finite are they measured one by one, as outputs of the root's backward
        call of the latest step the pass went through, for the producer rule and the report's replay."""
        if self.paused:
            return
        flag = nonfinite_flag(float_tensors_of(p.grad for _, p in self._named_params))
        if flag is None:
            return
        if not self._rows_on_host() and self.optimizer is not None and not self.listener.judge_late_now():
            self._grad_flag = (forwards[-1], flag)  # a device: read once per step, with the update's
            return
        if bool(flag):
            self.measure_gradients(forwards[-1])

    def take_grad_flag(self) -> tuple[int, torch.Tensor] | None:
        """Sentinel on a device: (step, device flag) of the latest backward pass, not read yet; the
        optimizer step reads it with its own (one read-back per training step)."""
        flag, self._grad_flag = self._grad_flag, None
        return flag

    def measure_gradients(self, f: int) -> None:
        """Sentinel, gradients judged non-finite: every parameter's gradient measured into the
        root's backward call of step ``f`` (rows the producer rule and the replay read)."""
        named = [(n, p.grad) for n, p in self._named_params if p.grad is not None]
        detail = self._detail.get(f)
        root = next((c for c in detail or () if c.parent is None and c.phase == "forward"), None)
        if root is None or self.grads is None:
            return
        per = self.grads.calls.setdefault(f, {})
        bc = per.get(root.start)
        if bc is None:
            bc = per[root.start] = Call(
                root.start, root.module, root.module_type, root.call_index, 0, None, f, phase="backward"
            )
            if detail is not None:
                detail.append(bc)
        items = [(f"grad of {n}", g.detach()) for n, g in named if g.is_floating_point()]
        refs = self.measure(items, step=f)
        events = self.grads.events
        bc.outputs += refs
        bc.order += list(range(events, events + len(refs)))  # parameter order stands for autograd's
        if bc.seq < 0:
            bc.seq = events
        self.grads.events += len(refs)

    def judge_backward(self, steps: Iterable[int]) -> bool:
        """Read the gradient rows of ``steps`` now and mark each step whose backward produced a
        non-finite gradient (``mark_late_fault``); True when any did."""
        hit = False
        for f in steps:
            if self._clean([f]):
                continue
            calls = [c for c in (self.grads.calls.get(f, {}).values() if self.grads else ()) if c.outputs]
            rows = self.sink.read([r for c in calls for _, r in c.outputs])
            if any(_nonfinite(rows[r]) for c in calls for _, r in c.outputs):
                self.mark_late_fault(f, "backward")
                hit = True
        return hit

    def judge_optimizer(self, step: int, calls: list[Call]) -> bool:
        """Read the rows of ``step``'s optimizer calls now: the step is marked when a parameter went
        non-finite from a finite value and gradient; True when one did."""
        if self._clean([step]):
            return False
        rows = self.sink.read([r for c in calls for refs in (c.inputs, c.outputs) for _, r in refs])
        for c in calls:
            if any(_nonfinite(rows[r]) for _, r in c.outputs) and not any(
                _nonfinite(rows[r]) for _, r in c.inputs
            ):
                self.mark_late_fault(step, "optimizer")
                return True
        return False

    def on_optimizer_end(self, forward: int, calls: list[Call]) -> None:
        """An optimizer step ended: judge it (``_judge_optimizer``), then tell the listener."""
        self._judge_optimizer(forward, calls)
        self.listener.on_optimizer_end(forward, calls)

    def _judge_optimizer(self, forward: int, calls: list[Call]) -> None:
        """On a host sink, judge the step now (a device sink: see ``on_backward_end``)."""
        if not self._rows_on_host() and not self.listener.judge_late_now():
            return
        self.judge_optimizer(forward, calls)

    def mark_late_fault(self, f: int, phase: str) -> None:
        """Step ``f`` went non-finite in a phase after its forward (which was judged finite)."""
        if f in self.failed_forwards() or not self.listener.accept_fault(f, phase):
            return
        runs = sorted(self._failed_runs + [[f, f]])
        merged: list[list[int]] = []
        for a, b in runs:
            if merged and a <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self._failed_runs = merged
        if self.first_failed is None or f < self.first_failed:
            self.first_failed = f
            snap = self._inputs.get(f)
            if snap is not None:
                snap.pin()
            self.listener.on_first_fault(f, phase)

    def failed_forwards(self) -> list[int]:
        """Every forward judged failing so far (folded ones included)."""
        return [i for a, b in self._failed_runs for i in range(a, b + 1)]

    def weights_version(self) -> int:
        """Sum of the parameters' version counters: it grows whenever any parameter is changed
        in place (an optimizer step), so a re-run can tell whether it still sees the weights
        a forward used."""
        return sum(map(_VERSION, self._params_all))

    def weights_changed_since(self, forward: int) -> bool:
        return forward in self._weights_at and self._weights_at[forward] != self.weights_version()

    # -- results ----------------------------------------------------------------------------
    def stats(self) -> list[TensorStats]:
        """Every stats row, read back from the device (again, when a CUDA graph wrote rows:
        each replay rewrites them)."""
        if self.sink.graph_rows:
            self.sink.refresh()
        return self.sink.rows()

    @property
    def n_forwards(self) -> int:
        return self._forward + 1
