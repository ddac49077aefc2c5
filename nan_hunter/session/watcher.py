"""``nan_hunter.watch(model)``: a recording session that owns ``report()``.

Capture (``capture.Recorder``) records calls and rows; this module turns them into a report:
the producer rule over the records (``locate.producer``), then — for the first failing forward,
from its kept inputs — a module-level re-run when the capture was at block level, and the
op-level re-run (``locate.first_op``). Re-runs happen at the watch's precision (the one dtype
rule: fp8 watches re-run under fp8 emulation) and under the context the forward ran in (autocast,
grad or inference mode, the RNG state, train/eval mode), on copies of its inputs. A report never
changes the user's model, cache, inputs or RNG: buffers and train/eval modes are restored, the
RNG is forked, and the watch's own hooks are paused while it re-runs.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any

import torch
from torch import nn

from ..capture.compiled_regions import eager_only
from ..capture.context import ForwardContext, outside_users_autocast, users_state_kept
from ..capture.listener import CaptureListener
from ..capture.recorder import Recorder
from ..capture.snapshot import Snapshot
from ..distributed.global_report import combine, local_reruns
from ..dtypes import RunDtype
from ..explain.fix_check import Region
from ..locate.first_op import locate_op
from ..locate.position import token_position
from ..locate.producer import (
    Finding,
    call_table,
    failed_inputs,
    first_finding,
    mask_notes,
    to_first_nonfinite,
)
from ..model.execute import run_context, weights_as
from ..report import FirstNonfinite
from ..tree import detached_copy
from .fault_policy import FaultPolicy
from .reproduce import faulted_again, reproducible_verdict
from .training import TrainingState
from .watch_report import WatchReport


class SessionListener(CaptureListener):
    """What a watch does at the recorder's events: keep every root call's inputs and ambient
    context, and hand training events (steps, faults, optimizer steps) to its ``TrainingState``."""

    def __init__(self, watch: Watch) -> None:
        self.w = watch

    def keeps_inputs(self) -> bool:
        return True

    def on_root_call(self, step: int) -> None:
        self.w.contexts[step] = ForwardContext.now(self.w.model)
        self.w.training.on_step(step)

    def on_forget(self, step: int) -> None:
        self.w.contexts.pop(step, None)

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


class Watch(Recorder):
    """Capture per-module statistics while the model runs; ``report()`` locates the first NaN/Inf.

    ``dtype``: the precision the model runs in (``"fp8-e4m3"`` makes re-runs emulate fp8 as the
    forward did); default: as the model is. ``retain``: forwards kept in full (calls, rows and,
    until judged on a device sink, inputs) besides the first failing one, which is always kept."""

    def __init__(self, model: nn.Module, level: str = "blocks", retain: int = 4, backend: str | None = None,
                 device: Any = None, dtype: str | RunDtype | None = None, fp8: Any = None, backward: bool = False,
                 optimizer: Any = None, scaler: Any = None, capsule_dir: str | None = None, arch: str | None = None,
                 on_fault: str = "record"):
        super().__init__(model, level=level, retain=retain, backend=backend, device=device, backward=backward,
                         optimizer=optimizer, listener=SessionListener(self),
                         underflow=False)  # always on: the CPU fast path stays one pass; a fault's re-run measures it
        self.run = dtype if isinstance(dtype, RunDtype) or dtype is None else RunDtype.of(dtype, fp8)
        self.contexts: dict[int, ForwardContext] = {}
        self._report: WatchReport | None = None
        self._report_at: tuple = ()
        self.training = TrainingState(self, scaler, capsule_dir, arch)
        self.policy = FaultPolicy(self, on_fault)  # on_fault: raise, skip, stop (session.fault_policy)
        #: report() replays the failing region, diagnoses it and checks the fix; a mode that records
        #: through a watch and locates the fault itself (``modes.watched``) turns this off, so the
        #: fault is replayed and fix-checked once, by the harness's assembler
        self.explains: bool = True

    @property
    def should_stop(self) -> bool:
        """True once a fault was seen under ``on_fault="stop"`` (loops and callbacks poll it). With
        ``optimizer=`` that step's update was not applied: saving now saves the last good state."""
        return self.policy.should_stop

    def report(self) -> WatchReport:
        """Locate the first non-finite value (re-running the first failing forward at finer levels
        when needed) and return a ``WatchReport``. The user's model, inputs, cache and RNG are left
        as they were."""
        key = (self.n_forwards, self.grads.events if self.grads else 0, self.optimizer.steps if self.optimizer else 0)
        if self._report is None or self.sink.graph_rows or self._report_at != key:
            # rows written by a captured CUDA graph change with every replay: read them again
            self.sink.refresh()
            self.poll_flags(wait=True)
            self.paused = True
            try:
                with users_state_kept(self.model), outside_users_autocast(), local_reruns(self):  # FSDP2: re-runs without collectives
                    self._report = self._locate()
            finally:
                self.paused = False
            self._report_at = key
        return combine(self._report, self)  # nan_hunter.watch() under torch.distributed: the global answer

    def _aggregates(self) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.aggregates.values()]

    def _locate(self) -> WatchReport:
        self.training.settle()
        rep = self._locate_phases()
        self.training.finish(rep)
        self.policy.finish(rep)  # run["skipped_steps"], steps as a framework counts them
        reproducible_verdict(rep, self.sink.device)  # cause not_reproducible (session.reproduce)
        return rep

    def _locate_phases(self) -> WatchReport:
        rows = self.sink.rows()
        skipped = set(self.training.scaler_skipped)
        calls = [c for c in self.calls if not (c.phase == "backward" and c.input_index in skipped)]
        finding = first_finding(calls, rows)
        notes = mask_notes(calls, rows)
        failed = sorted(set(self.failed_forwards()) | set(failed_inputs(calls, rows)))
        if self.sink.unmeasured:
            kinds = sorted({why.split(":")[0] for _, why in self.sink.unmeasured})
            notes.append(f"{len(self.sink.unmeasured)} tensor(s) could not be read and were skipped (their rows "
                         f"read as empty): {', '.join(kinds[:3])}")
        if self.forwards_folded:
            notes.append(f"{self.forwards_folded} of {self.n_forwards} forwards were folded into per-module "
                         "aggregates (report().aggregates); the first failing forward and the latest "
                         f"{self.window} are kept in full")
        if finding is not None and finding.call.phase != "forward":
            return self.training.locate(finding, calls, rows, notes, failed)
        reproduced: bool | None = None  # first_nonfinite.reproducible: the re-run decides
        if finding is not None:
            idx = finding.call.input_index
            snap = self.inputs_of(idx)
            state = self.training.weights_at_fault(idx)
            missing = f"op-level location{' and module-level location' if self.level == 'blocks' else ''}"
            if snap is not None and self.weights_changed_since(idx) and state is None:
                notes.append(f"parameters changed in place after forward {idx} (an optimizer step?): it was not "
                             f"re-run, since a re-run would use the new weights, so the {missing} is missing; "
                             "call report() before the weights change to get them")
            elif snap is not None:
                if snap.changed_since():
                    notes.append(f"{snap.changed_since()} input tensor(s) of forward {idx} were changed in place "
                                 "after it started; the re-run uses them as they are now")
                if idx in self.opaque_forwards:
                    notes.append(f"forward {idx} ran under torch.compile: capture cannot see inside a compiled "
                                 "region, so the module and op come from re-running that forward eagerly (the "
                                 "original module, not the compiled wrapper) from its captured inputs")
                with weights_as(self.model, state):
                    fine = self._refine(snap, idx)
                if fine is not None:
                    if fine.first_nonfinite is not None:
                        fine.first_nonfinite.reproducible = True
                    fine.failed_inputs = sorted(set(failed) | set(fine.failed_inputs))
                    fine.notes = notes + [n for n in fine.notes if n not in notes]
                    fine.aggregates, fine.n_forwards = self._aggregates(), self.n_forwards
                    return fine
                reproduced = None if idx in self.opaque_forwards or snap.changed_since() else False
                notes.append(f"re-running forward {idx} eagerly gave finite values: the non-finite value exists only "
                             "in the compiled run (`nanhunter scan --compile` finds where compiled and eager part)"
                             if idx in self.opaque_forwards else
                             f"re-running forward {idx} did not reproduce the non-finite value (a nondeterministic "
                             "op, or inputs changed in place since?), so this location comes from the capture alone")
            else:
                notes.append(f"inputs of forward {idx} were not kept, so the {missing} is missing")
        fnf = self._owner_of_weights(finding, to_first_nonfinite(finding)) if finding else None
        if fnf is not None:
            fnf.reproducible = reproduced
        return WatchReport(fnf, call_table(calls, rows), failed, notes, aggregates=self._aggregates(),
                           n_forwards=self.n_forwards)

    def _owner_of_weights(self, f: Finding, fnf: FirstNonfinite) -> FirstNonfinite:
        """At level "blocks" a call's parameters are its whole subtree's (``blocks.0.mlp.up.weight``
        for a block, ``head.weight`` for the root): name the module that owns the bad tensor."""
        if f.role != "weights" or not f.tensor or "." not in f.tensor:
            return fnf
        sub, _, leaf = f.tensor.rpartition(".")
        owner = f"{f.call.module}.{sub}" if f.call.module else sub
        try:
            mtype = type(self.model.get_submodule(owner)).__name__
        except AttributeError:
            return fnf
        return dataclasses.replace(fnf, module=owner, module_type=mtype, tensor=leaf, call_index=0)

    def step_forward(self, input_index: int, snap: Snapshot | None = None) -> Any:
        """A function that re-runs forward ``input_index`` from copies of its kept inputs, under the
        precision and ambient context it ran in (grad mode as it had it); None when not kept."""
        snap = snap or self.inputs_of(input_index)
        if snap is None:
            return None
        ctx = self.contexts.get(input_index, ForwardContext(False, ()))

        def rerun() -> Any:
            args, kwargs = snap.rerun()
            with contextlib.ExitStack() as stack:
                ctx.enter(stack)
                stack.enter_context(run_context(self.run))
                stack.enter_context(eager_only())  # compiled submodules too: capture must see inside
                if ctx.training is not None and self.model.training != ctx.training:
                    self.model.train(ctx.training)
                ctx.seed()
                return self.model(*args, **kwargs)
        return rerun

    def state_kept(self) -> contextlib.AbstractContextManager:
        """The user's RNG, buffers and train/eval modes, restored after a re-run."""
        return users_state_kept(self.model)

    def _refine(self, snap: Snapshot, input_index: int) -> WatchReport | None:
        """Module- then op-level location for one kept forward, on copies of its inputs, under
        the precision and ambient context that forward ran in."""
        ctx = self.contexts.get(input_index, ForwardContext(False, ()))
        rerun = self.step_forward(input_index, snap)

        fine = Recorder(self.model, level="modules", retain=1, device=self.sink.device, first_step=input_index)
        with fine:
            rerun()
        rows = fine.sink.rows()
        f = first_finding(fine.calls, rows)
        if f is None or not faulted_again(self.calls_of(input_index) or [], self.sink.rows(), fine.calls, rows):
            return None  # the re-run did not fault again: not reproducible (session.reproduce)
        with contextlib.ExitStack() as stack:
            ctx.enter(stack)
            ev, target, margs, mkw = locate_op(self.model, rerun, f, self.run, grad=None)
            fnf = to_first_nonfinite(f, ev)
            if f.role != "input":  # which token row holds it (a decode step: its position in the sequence)
                stack.enter_context(run_context(self.run))
                stack.enter_context(torch.no_grad())
                tp = token_position(target(*detached_copy(margs), **detached_copy(mkw)), snap.kwargs)
                fnf.position = tp.position
        notes = mask_notes(fine.calls, rows)
        if f.role != "input" and tp.note:
            notes.append(tp.note)
        if f.call.module_type == "MultiheadAttention" and ev is not None and "_native_multi_head_attention" not in ev.op:
            notes.append(f"{f.call.module} (nn.MultiheadAttention) took its slow path on the re-run (in-projection, "
                         f"scaled_dot_product_attention, out-projection as separate ops), as it does with grad on, in "
                         f"train mode or when query, key and value differ: {ev.op} is an op of that path, not of "
                         "the fused torch._native_multi_head_attention")
        rep = WatchReport(fnf, call_table(fine.calls, rows), failed_inputs(fine.calls, rows), notes, ev)
        if f.role == "producer":  # replayed per dtype and its fix checked when diagnosed (TrainingState.finish)
            # a copy: the weights the fault ran with, whatever the training loop does to them next
            rep.region = Region(f.call.module, copy.deepcopy(target), margs, mkw)
        return rep
