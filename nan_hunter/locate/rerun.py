"""How a recording's failing step is run again: the ``Rerun`` protocol ``locate`` asks, and
``KeptSteps``, what every recording that kept its steps' inputs supports.

A re-run is always of copies: the step's root forward from fresh copies of the inputs it was given
(``capture.snapshot``), under the context it ran in (grad or inference mode, autocast, train/eval
mode, the RNG: ``capture.context``), at the run's precision (fp8 emulation re-applied), compiled
submodules run eagerly so capture sees inside; its backward from the gradients the recorder kept at
the model's outputs (``locate.backward_op``), so the user's loss is not needed. What differs is
given to ``KeptSteps``: the watch adds the weights of the failing step (when an optimizer step has
changed them since) and the optimizer's pre-step state (``session.training_state``); a capsule gives its
recorded optimizer state; the forward mode says where offloaded weights are put in place
(``--device-map``) and that the fix may be checked on the whole model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from torch import nn

from ..capture.compiled_regions import eager_only
from ..capture.context import ForwardContext, users_state_kept
from ..capture.recorder import Recorder
from ..capture.snapshot import Snapshot
from ..dtypes import RunDtype, step_precision
from ..model.execute import run_context
from ..model.whole import WholeModel
from .backward_op import rerun_backward
from .training_phases import OptimizerPieces

NO_CONTEXT = ForwardContext(False, ())  # a step whose context was not recorded: no grad, no autocast


class Rerun(Protocol):
    """What ``locate`` asks of whoever recorded a run (the watch, each mode of the harness)."""

    model: nn.Module
    run: RunDtype | None  # the precision forwards ran at (fp8 emulation is re-applied on re-runs)

    def inputs(self, step: int) -> Snapshot | None:
        """What the step's root forward was given (None: not kept)."""

    def context(self, step: int) -> ForwardContext:
        """The ambient state the step's forward ran under."""

    def forward(self, step: int) -> Callable[[], Any] | None:
        """A function re-running the step's root forward from copies of its inputs, in its context."""

    def train(self, step: int) -> Callable[[], Any] | None:
        """The step's forward and its backward from the gradients kept at the model's outputs."""

    def weights(self, step: int) -> dict[str, Any] | None:
        """The weights the step ran with, when they have changed since (None: as they are now)."""

    def precision(self, step: int, phase: str) -> RunDtype | None:
        """The precision the step's ops of ``phase`` computed in."""

    def optimizer(self, step: int) -> OptimizerPieces | None:
        """The step's optimizer state before it ran (None: not kept)."""

    def optimizer_facts(self, step: int, param: str | None) -> dict[str, Any] | None:
        """What explains ``param`` going non-finite, read right after the live step (None: not read)."""

    def around(self, module: str) -> contextlib.AbstractContextManager[object]:
        """A context that puts ``module``'s weights in place while a region of it runs."""

    def whole(self, step: int) -> WholeModel | None:
        """The model and the step's inputs when a fix may be checked on a copy of the whole model."""

    def kept(self) -> contextlib.AbstractContextManager[object]:
        """Everything re-runs may change of the model's state, restored after."""


class KeptSteps:
    """The re-runs of a recorder that kept its steps' inputs and contexts (``capture.listener.KeepSteps``)."""

    def __init__(
        self,
        recorder: Recorder,
        contexts: Mapping[int, ForwardContext],
        run: RunDtype | None,
        *,
        around: Callable[[str], contextlib.AbstractContextManager[object]] | None = None,
        whole: Callable[[int], WholeModel | None] | None = None,
        optimizer: OptimizerPieces | None = None,
    ) -> None:
        self.recorder = recorder
        self.model = recorder.model
        self.contexts = contexts
        self.run = run
        self._around = around
        self._whole = whole
        self._optimizer = optimizer

    def inputs(self, step: int) -> Snapshot | None:
        return self.recorder.inputs_of(step)

    def context(self, step: int) -> ForwardContext:
        return self.contexts.get(step, NO_CONTEXT)

    def forward(self, step: int) -> Callable[[], Any] | None:
        snap = self.inputs(step)
        if snap is None:
            return None
        ctx, model, run = self.context(step), self.model, self.run

        def rerun() -> Any:
            args, kwargs = snap.rerun()
            with contextlib.ExitStack() as stack:
                ctx.enter(stack)
                stack.enter_context(run_context(run))
                stack.enter_context(eager_only())  # compiled submodules too: capture must see inside
                if ctx.training is not None and model.training != ctx.training:
                    model.train(ctx.training)
                ctx.seed()
                return model(*args, **kwargs)

        return rerun

    def train(self, step: int) -> Callable[[], Any] | None:
        grads = self.recorder.grads.root_grads.get(step) if self.recorder.grads is not None else None
        fwd = self.forward(step)
        if grads is None or fwd is None:
            return None
        return lambda: rerun_backward(self.model, fwd, grads)

    def weights(self, step: int) -> dict[str, Any] | None:
        return None

    def precision(self, step: int, phase: str) -> RunDtype | None:
        ctx = self.contexts.get(step)
        amp = ctx.autocast if ctx is not None and phase != "optimizer" else ()
        p = next(iter(self.model.parameters()), None)
        return step_precision(
            self.run, amp, self.recorder.sink.device.type, p.dtype if p is not None else None
        )

    def optimizer(self, step: int) -> OptimizerPieces | None:
        return self._optimizer

    def optimizer_facts(self, step: int, param: str | None) -> dict[str, Any] | None:
        return None

    def around(self, module: str) -> contextlib.AbstractContextManager[object]:
        return self._around(module) if self._around is not None else contextlib.nullcontext()

    def whole(self, step: int) -> WholeModel | None:
        return self._whole(step) if self._whole is not None else None

    def kept(self) -> contextlib.AbstractContextManager[object]:
        return users_state_kept(self.model)
