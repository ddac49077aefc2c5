"""``transformers.Trainer(..., callbacks=[NanHunterCallback()])``: watch the Trainer's model with
the optimizer (and GradScaler) the Trainer creates; stop, skip or raise at the first fault
(``integrations.callback_core``). ``first_nonfinite.step`` is ``state.global_step`` when the failing
step began."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from .callback_core import CallbackCore


class NanHunterCallback(TrainerCallback):
    def __init__(self, level: str = "blocks", on_fault: str = "stop", capsule_dir: str | None = None,
                 report_path: str | None = None, arch: str | None = None) -> None:
        self.core = CallbackCore(level, on_fault, capsule_dir, report_path, arch,
                                 hf_logging.get_logger("transformers.trainer"))

    @property
    def report(self) -> Any:
        """The report of the first fault (same shape as ``watch().report()``); None on a clean run."""
        return self.core.report

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        self.core.start(model, optimizer, getattr(optimizer, "scaler", None))  # accelerate's GradScaler

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.core.step_begin(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.core.step_end():
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.core.end()
