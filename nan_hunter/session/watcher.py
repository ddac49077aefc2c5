"""``nan_hunter.watch(model)``: a recording session that owns ``report()``.

A ``Watch`` holds one capture ``Recorder`` (it records calls and rows and keeps every root call's
inputs and context; a numerics trace, ``trace=``, is an observer of the same recording) and the
session's parts, each given the narrow view of the watch it needs (``training_state.TrainingHost``,
``fault_policy.PolicyHost``); ``report()`` is the one staircase every report takes: the recording judged by the
producer rule (``locate.judged_recording``), the first fault located by re-running its step
(``locate.first_fault.locate``, with the watch's re-runs: ``WatchRerun``), then explained and
assembled into a report v1 (``explain.assemble``: replay, diagnosis, verified fix, once), returned as
a ``WatchReport`` (that report, printable, with the watch's extras). Re-runs happen at the watch's
precision (the one dtype rule: fp8 watches re-run under fp8 emulation) and under the context the
forward ran in (autocast, grad or inference mode, the RNG state, train/eval mode), on copies of its
inputs. A report never changes the user's model, cache, inputs or RNG: buffers and train/eval
modes are restored, the RNG is forked, and the watch's own hooks are paused while it re-runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..capture.context import ForwardContext, outside_users_autocast, users_state_kept
from ..capture.floats import float_items
from ..capture.listener import KeepSteps
from ..capture.recorder import Recorder
from ..capture.sentinel import any_nonfinite, float_tensors_of
from ..capture.signals import SampledSignals
from ..config import default_config
from ..distributed import collectives as dist
from ..distributed.global_report import combine, local_reruns
from ..dtypes import autocast_of
from ..explain.assemble import assemble, run_info
from ..forecast.overflow import forecast
from ..forecast.precursors import Precursor, PrecursorWatch
from ..locate.first_fault import locate
from ..locate.judged_recording import Recording
from ..model.execute import weights_as
from ..report import Report
from ..serving import outcome as serving
from ..serving.tracker import PackedBatches
from ..trace.recorder import TraceRecorder
from .fault_policy import FaultPolicy
from .options import WatchOptions
from .training_state import TrainingState, WatchRerun
from .watch_report import WATCH_CHECKPOINT, WatchReport

if TYPE_CHECKING:  # pragma: no cover
    from ..capture.gradients import GradientHooks
    from ..capture.optimizer_step import OptimizerHooks
    from ..capture.recorder import ModuleAggregate
    from ..capture.records import Call
    from ..capture.sink import StatsSink
    from ..capture.snapshot import Snapshot

REPLAYS = 2  # extra replays of a failing step that did not reproduce (transient or non-deterministic?)


class SessionListener(KeepSteps):
    """What a watch does at the recorder's events: keep every root call's inputs and ambient
    context (``KeepSteps``), and hand training events (steps, faults, optimizer steps) to its
    ``TrainingState`` and its fault policy."""

    def __init__(self, watch: Watch) -> None:
        super().__init__(None)  # the model is set by the watch once ``Recorder`` has unwrapped it
        self.w = watch

    def on_root_call(self, step: int) -> None:
        self.contexts[step] = ForwardContext.now(self.model)  # KeepSteps's, without a super() call per step
        self.w.training.on_step(step)

    def on_first_fault(self, step: int, phase: str) -> None:
        self.w.training.on_first_fault(step, phase)
        self.w.policy.on_first_fault(step, phase)  # on_fault="raise" raises here

    def accept_fault(self, step: int, phase: str) -> bool:
        return self.w.training.accept(step, phase)

    def on_optimizer_start(self, step: int, hooks: Any) -> None:
        self.w.training.before_optimizer_step(step, hooks)
        self.w.policy.before_step(hooks)  # on_fault="skip" (and "stop"): the pre-step copy

    def on_forward_end(self, step: int) -> None:
        self.w.policy.after_forward(step)  # device sink, on_fault raise/stop: the forward's verdict now

    def on_optimizer_end(self, step: int, calls: list[Any]) -> None:
        if self.w.optimizer is not None:
            self.w.policy.after_step(step, self.w.optimizer, calls)  # skip, stop: undo a faulty step

    def judge_late_now(self) -> bool:
        t = self.w.training
        return self.w.first_failed is None and (t.capsule_dir is not None or t.scaler is not None)

    def grads_needed(self, step: int, first_failed: int | None) -> bool:
        return step == first_failed or step in self.w.training.pending


#: what a watch shows of its recording, read through to its ``Recorder`` (``w.first_failed``,
#: ``w.calls``, ``w.n_forwards``...: names users and the session's parts read on the watch)
RECORDING_VIEW = (
    "aggregates",
    "calls",
    "calls_of",
    "current_step",
    "failed_forwards",
    "first_failed",
    "forwards_folded",
    "grads",
    "inputs_of",
    "judge_backward",
    "judge_finished",
    "judge_flagged",
    "judge_optimizer",
    "late_phases",
    "latent",
    "level",
    "listener",
    "mark_late_fault",
    "measure",
    "model",
    "n_forwards",
    "op_records",
    "opaque_forwards",
    "optimizer",
    "poll_flags",
    "retain",
    "retained",
    "root_hooked",
    "rows_on_host",
    "sample_every",
    "sampled_steps",
    "sentinel",
    "sink",
    "stats",
    "weights_changed_since",
    "weights_version",
    "window",
    "_detail",
    "_inputs",
    "_stack",  # read by tests of the recording's bookkeeping
)


class Watch:
    """Capture per-module statistics while the model runs; ``report()`` locates the first NaN/Inf.

    ``dtype``: the precision the model runs in (``"fp8-e4m3"`` makes re-runs emulate fp8 as the
    forward did); default: as the model is. ``retain``: forwards kept in full (calls, rows and,
    until judged on a device sink, inputs) besides the first failing one, which is always kept.
    The recording is ``recorder`` (a ``capture.Recorder``); the names in ``RECORDING_VIEW`` read
    through to it."""

    if TYPE_CHECKING:  # the names of RECORDING_VIEW the package reads, typed as the recorder has them
        aggregates: dict[str, ModuleAggregate]
        current_step: int
        first_failed: int | None
        grads: GradientHooks | None
        late_phases: bool
        latent: list[dict[str, Any]]
        level: str
        listener: SessionListener  # the recorder's, made here
        model: nn.Module
        n_forwards: int
        optimizer: OptimizerHooks | None
        sample_every: int
        sentinel: bool
        sink: StatsSink
        window: int

        def calls_of(self, step: int) -> list[Call] | None: ...
        def failed_forwards(self) -> list[int]: ...
        def inputs_of(self, forward: int) -> Snapshot | None: ...
        def judge_backward(self, steps: Iterable[int]) -> bool: ...
        def judge_finished(self, upto: int) -> None: ...
        def judge_optimizer(self, step: int, calls: list[Call]) -> bool: ...
        def mark_late_fault(self, f: int, phase: str) -> None: ...
        def poll_flags(self, wait: bool = False, upto: int = -1) -> None: ...
        def rows_on_host(self) -> bool: ...
        def weights_changed_since(self, forward: int) -> bool: ...

    def __init__(self, model: nn.Module, options: WatchOptions | None = None, **kw: Any):
        """``options`` (``session.options.WatchOptions``), or its fields as keywords, checked there once."""
        o = options if options is not None else WatchOptions(**kw)
        assert (
            o.level is not None and o.sample_every is not None
        )  # WatchOptions sets both from their defaults
        self.recorder = Recorder(
            model,
            level=o.level,
            retain=o.retain,
            backend=o.backend,
            device=o.device,
            backward=o.backward,
            optimizer=o.optimizer,
            listener=SessionListener(self),
            underflow=False,
            sample_every=o.sample_every,
        )  # always on: the CPU fast path stays one pass; a fault's re-run measures it
        self.listener.model = self.model  # the unwrapped module (not a compiled or DDP wrapper)
        self.options = o
        self.run = o.run
        self.collective = (
            o.collective
        )  # report() is global under torch.distributed (distributed.global_report)
        self._report: WatchReport | None = None
        self._report_at: tuple = ()
        self.training = TrainingState(self, o.scaler, o.capsule_dir, o.arch)
        self.policy = FaultPolicy(self, o.policy)  # on_fault: raise, skip, stop, abort (session.fault_policy)
        self.rerun = WatchRerun(self)  # how report() runs a step again (locate.rerun)
        # continuous batching: requests of packed forwards, on_fault="abort" (serving.tracker)
        self.serving = PackedBatches(self, abort=o.policy.aborts_requests)
        self.recorder.add_companion(self.serving)
        # the forecast and the precursors (contract v1.4): recorded on sampled steps only
        self.signals = SampledSignals(self.model, o.optimizer) if self.sample_every else None
        self.precursor_watch = PrecursorWatch()  # thresholds: configs/default.yaml, precursors
        if self.signals is not None:
            self.recorder.samplers.append(self.signals)
            self.recorder.add_companion(self.signals)
        if (
            o.trace is not None
        ):  # a numerics trace of every forward, an observer of this recording (trace.recorder)
            self.recorder.add_observer(
                TraceRecorder(
                    None, str(o.trace), o.trace_level, dtype=self.run.name if self.run is not None else None
                )
            )

    # -- the recording ----------------------------------------------------------------------------
    def __enter__(self) -> Watch:
        self.recorder.attach()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.recorder.detach()

    def attach(self) -> None:
        self.recorder.attach()

    def detach(self) -> None:
        self.recorder.detach()

    @property
    def paused(self) -> bool:
        """While True nothing is recorded (the watch's own re-runs)."""
        return self.recorder.paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self.recorder.paused = value

    def step_label(self, forward: int) -> int:
        """The framework's step (``state.global_step``) forward ``forward`` belongs to (itself
        when no framework labels steps)."""
        return self.policy.label(forward)

    def label_step(self, global_step: int, forward: int | None = None) -> None:
        """The framework's step counter from forward ``forward`` on (default: the next forward; the
        callbacks call it as a step begins)."""
        self.policy.step_label[self.n_forwards if forward is None else forward] = int(global_step)

    def local_report(self) -> WatchReport:
        """This rank's report, never the global one (a collective: not from inside a hook or a
        callback that only some ranks reach)."""
        was = self.collective
        self.collective = False
        try:
            return self.report()
        finally:
            self.collective = was

    @property
    def contexts(self) -> dict[int, ForwardContext]:
        """The ambient context of every kept step's forward (``capture.listener.KeepSteps``)."""
        return self.listener.contexts

    @property
    def should_stop(self) -> bool:
        """True once a fault was seen under ``on_fault="stop"`` (loops and callbacks poll it). With
        ``optimizer=`` that step's update was not applied: saving now saves the last good state."""
        return self.policy.should_stop

    def report(self) -> WatchReport:
        """Locate the first non-finite value (re-running the first failing forward at finer levels
        when needed) and return a ``WatchReport``. The user's model, inputs, cache and RNG are left
        as they were."""
        key = (
            self.n_forwards,
            self.grads.events if self.grads else 0,
            self.optimizer.steps if self.optimizer else 0,
        )
        if self._report is None or self.sink.graph_rows or self._report_at != key:
            # rows written by a captured CUDA graph change with every replay: read them again
            self.sink.refresh()
            self.poll_flags(wait=True)
            self.paused = True
            try:
                with (
                    users_state_kept(self.model),
                    outside_users_autocast(),
                    local_reruns(self),
                ):  # FSDP2: re-runs without collectives
                    self._report = self._locate()
            finally:
                self.paused = False
            self._report_at = key
        return combine(self._report, self)  # nan_hunter.watch() under torch.distributed: the global answer

    def _aggregates(self) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.aggregates.values()]

    def _locate(self) -> WatchReport:
        t = self.training
        t.settle()
        rec = Recording.of(self.recorder, t.scaler_skipped)
        rerun = serving.origin_rerun(
            self.serving, rec, self.rerun
        )  # a packed fault: its origin request alone
        loc = locate(rec, rerun) if rec.finding is not None else None
        # the run's precision is what its forwards computed in (an autocast dtype, not the fp32
        # parameters'): the failing step's, else the latest kept step's
        step = loc.first.step if loc is not None else self.n_forwards - 1
        ctx = self.contexts.get(step)
        rep = Report(checkpoint=dict(WATCH_CHECKPOINT), mode="watch", notes=list(rec.notes))
        rep.run = run_info(
            self.rerun.precision(step, "forward"),
            self.sink.device,
            self.n_forwards,
            rec.failed,
            backward=self.grads is not None,
            optimizer_steps=self.optimizer.steps if self.optimizer else None,
            scaler_skipped_steps=sorted(t.scaler_skipped) if t.scaler is not None else None,
            capsule=t.capsule,
            autocast=autocast_of(ctx.autocast if ctx is not None else (), self.sink.device.type),
        )
        rep.modules = loc.table if loc is not None and loc.table is not None else rec.table()
        t.finish(rep)  # what training adds: its notes (GradScaler skips, the capsule)
        self._level_facts(rep)
        if loc is not None:
            if loc.first.reproducible is False and loc.first.phase == "forward":
                rep.notes.append(self._replays_again(loc.first.step))
            assemble(
                rep, loc, None, device=str(self.sink.device), rank=dist.rank() if dist.active() else None
            )
        self.policy.finish(rep)  # run["skipped_steps"], steps as a framework counts them
        serving.finish(self.serving, rep, rec)  # run.requests, run.evict
        return WatchReport(rep, loc, self._aggregates())

    def _level_facts(self, rep: Report) -> None:
        """``run.level``, ``run.sample_every`` and, for a sentinel, the latent faults its sampled
        steps saw (a non-finite block output the root's outputs did not show: not a fault)."""
        assert rep.run is not None  # _locate sets it first
        rep.run["level"] = self.level
        rep.run["sample_every"] = self.sample_every if self.sentinel else None
        rep.forecast = self.forecast()
        rep.warnings = [{**w.to_dict(), "step": self.policy.label(w.step)} for w in self.precursors()]
        if self.sentinel:
            rep.run["latent"] = [dict(x) for x in self.latent]
            for x in self.latent[:3]:
                rep.notes.append(
                    f"latent: at sampled step {self.policy.label(x['step'])} {x['module'] or '(root)'} "
                    "gave a non-finite output that was masked before the model's outputs (not a fault)"
                )

    def forecast(self, run_dtype: str | None = None) -> list[dict[str, Any]] | None:
        """Contract v1.4 ``forecast`` from the sampled steps so far (``forecast.overflow``); None when
        none was sampled. ``run_dtype``: the precision the headroom is measured against first."""
        if self.signals is None:
            return None
        sig = self.signals.signals
        if run_dtype is None:  # the watch's dtype, else what the latest sampled step computed in (autocast)
            run_dtype = self.run.compute if self.run is not None else sig.dtype
        cfg = default_config().forecast
        return forecast(sig, run_dtype, cfg.targets, cfg.window)

    def precursors(self) -> list[Precursor]:
        """The precursor warnings raised so far (``forecast.precursors``), each judged on the history
        up to its sampled step; never faults. A sampled step whose optimizer step has not run yet
        waits for the next call."""
        if self.signals is None:
            return []
        sig = self.signals
        self.precursor_watch.update(sig.signals, before=sig.signals.steps[-1] if sig.step_pending else None)
        return list(self.precursor_watch.found)

    def _replays_again(self, step: int, times: int = REPLAYS) -> str:
        """The failing forward did not fault again when re-run: re-run it ``times`` more, to tell
        a transient (every replay finite: hardware, a flipped bit, a value changed once) from
        non-determinism (some replays fault again)."""
        fwd = self.rerun.forward(step)
        state = self.rerun.weights(step)
        if fwd is None:
            return f"step {step} could not be replayed again: its inputs are no longer kept"
        bad = 0
        for _ in range(times):
            with torch.no_grad(), weights_as(self.model, state):
                out = fwd()
            if any_nonfinite(float_tensors_of(t for _, t in float_items(out))):
                bad += 1
        if bad == 0:
            return (
                f"not reproducible: step {step} replayed {times + 1} times from its kept inputs, every "
                "replay finite — a transient (hardware, a flipped bit, a value changed once), not the model"
            )
        return (
            f"not reproducible: step {step} replayed {times + 1} times, {bad} of them non-finite — "
            "the model is non-deterministic here (a nondeterministic kernel or a race)"
        )

    def step_forward(self, input_index: int) -> Any:
        """A function that re-runs forward ``input_index`` from copies of its kept inputs, under the
        precision and ambient context it ran in (grad mode as it had it); None when not kept."""
        return self.rerun.forward(input_index)

    def state_kept(self) -> Any:
        """The user's RNG, buffers and train/eval modes, restored after a re-run."""
        return users_state_kept(self.model)


def _read_through(name: str) -> property:
    return property(
        lambda w: getattr(w.recorder, name), doc=f"The recording's ``{name}`` (``capture.Recorder``)."
    )


for _name in RECORDING_VIEW:
    setattr(Watch, _name, _read_through(_name))
