"""What a recording tells whoever builds on it (``session.Watch``): the recorder calls a
``CaptureListener`` at the points where a session acts — a root call starts, a step is folded
away, the first fault is known, an optimizer step starts — and asks it three questions. The base
class is the plain recorder's answers (keep nothing, accept every fault), so a recorder without a
session needs none."""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from typing import Any

from .context import ForwardContext


class CaptureListener:
    """Callbacks and questions of a ``Recorder`` (all steps are root-call indices)."""

    def keeps_inputs(self) -> bool:
        """Whether root inputs are snapshotted (a session's report re-runs them)."""
        return False

    def on_root_call(self, step: int) -> None:
        """A root forward starts (a session records its ambient context here)."""

    def on_forget(self, step: int) -> None:
        """A step was folded away (a session drops what it kept for it)."""

    def on_first_fault(self, step: int, phase: str) -> None:
        """The first failing step is known (a session keeps its weights, writes a capsule)."""

    def accept_fault(self, step: int, phase: str) -> bool:
        """Whether a non-finite backward or optimizer phase counts as a fault (a session with a
        GradScaler tells skipped steps from real faults)."""
        return True

    def judge_late_now(self) -> bool:
        """Whether a device sink reads backward and optimizer rows back as soon as a phase ends
        (a session that writes a capsule or tells GradScaler skips needs it before the weights change)."""
        return False

    def grads_needed(self, step: int, first_failed: int | None) -> bool:
        """Whether the gradients that reached the root outputs in ``step`` must stay kept."""
        return step == first_failed

    def on_optimizer_start(self, step: int, hooks: Any) -> None:
        """Before ``optimizer.step()`` of a kept step (a session copies what a capsule needs)."""

    def on_forward_end(self, step: int) -> None:
        """A root forward whose rows are on a device ended (a session acting at the fault reads its
        flag). Not called for a host sink's forward: it was judged already, at no cost."""

    def on_optimizer_end(self, step: int, calls: list[Any]) -> None:
        """``optimizer.step()`` of a kept step ended and was judged (a session may undo it)."""


class KeepSteps(CaptureListener):
    """Keeps what a report re-runs a step from: every root call's inputs (the recorder's
    snapshots) and the ambient context it ran under (``contexts``: grad and inference mode,
    autocast, train/eval mode, the RNG), dropped when the step is folded away. The harness's modes
    record with it; a watch's session listener is one."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.contexts: dict[int, ForwardContext] = {}

    def keeps_inputs(self) -> bool:
        return True

    def on_root_call(self, step: int) -> None:
        self.contexts[step] = ForwardContext.now(self.model)

    def on_forget(self, step: int) -> None:
        self.contexts.pop(step, None)


class CallObserver:
    """Sees every module call of a recording, whatever its level: the ``Recorder`` hooks every
    module (the root's hooks outside a compiled region, as its own) for its observers and calls
    them at each call's start and end, never while it is paused (``Recorder.observers_only``
    excepted) or while dynamo traces. Its own hooks' statistics run with dispatch modes off, so an
    observer's ``op_mode`` sees the model's ops only. A numerics trace is one
    (``trace.recorder.TraceRecorder``)."""

    def attached(self, recorder: Any) -> None:
        """The recorder was attached (its ``model`` is the unwrapped module)."""

    def call_start(self, name: str, module: Any, args: tuple, kwargs: dict) -> None:
        """A module call starts (pre-hook, after the recorder's own)."""

    def call_end(self, name: str, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        """A module call ended (post-hook, after the recorder's own; also when forward raised)."""

    def op_mode(self) -> Any:
        """A ``TorchDispatchMode`` the recorder enters while attached (after its own), or None."""
        return None

    def input(self, index: int) -> Any:
        """A context: the root calls inside are data-set input ``index`` (``Recorder.input_run``)."""
        return contextlib.nullcontext()

    def run(self, r: int) -> Any:
        """A context: run ``r`` of the current input (0 first; later ones: its ``repeats``)."""
        return contextlib.nullcontext()

    def repeats(self) -> int:
        """How many times each input is run (a trace's ``--repeat N``; 1: once)."""
        return 1

    def detached(self) -> None:
        """The recorder's hooks are gone (a trace writes what it holds and closes its file)."""


class Companion:
    """Something that watches the same model as a ``Recorder`` for as long as it is attached
    (``Recorder.add_companion``: a watch's ``serving.PackedBatches`` and ``capture.signals``).
    Its root callbacks run inside the recorder's own root hooks — one pre-hook and one post-hook
    per root call for the recorder and every companion, outside compiled regions — after the
    recorder's part, so they see the step it started (``current_step``, its kept inputs) and, at
    the end, the sentinel's verdict on the outputs (``Recorder.finite_outputs``). They run even
    while the recording is paused (a companion checks that itself)."""

    def attach(self) -> None:
        """The recorder was attached (hook what else it needs)."""

    def detach(self) -> None:
        """The recorder is being detached (remove everything it hooked)."""

    def inputs_left_out(self, kwargs: dict) -> Collection[str]:
        """Keywords a root forward's kept inputs leave out (and never walk)."""
        return ()

    def root_start(self, args: tuple, kwargs: dict) -> None:
        """A root call starts (after the recorder's part)."""

    def root_end(self, args: tuple, kwargs: dict, output: Any) -> None:
        """A root call ended, also when its forward raised (``output`` None then)."""

    def overrides(self, name: str) -> bool:
        """Whether this companion has its own ``name`` callback (the recorder calls only those:
        a root call pays for no empty one)."""
        return getattr(type(self), name) is not getattr(Companion, name)
