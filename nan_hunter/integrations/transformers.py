"""``transformers.Trainer(..., callbacks=[NanHunterCallback()])``: watch the Trainer's model with
the optimizer (and GradScaler) the Trainer creates; stop, skip or raise at the first fault
(``integrations.callback_core``). ``first_nonfinite.step`` is ``state.global_step`` when the failing
step began.

The Trainer's own trap: with ``logging_nan_inf_filter=True`` (its default) a step whose loss is
NaN or Inf is left out of the logged ``loss``, which then averages the finite steps — the curve
looks healthy. The callback reads the loss of each training forward (``output.loss``, as a device
flag) and, when the Trainer logs, names the steps the filter hid."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from .callback_core import CallbackCore, loss_of


class NanHunterCallback(TrainerCallback):
    def __init__(self, level: str | None = None, on_fault: str = "stop", capsule_dir: str | None = None,
                 report_path: str | None = None, arch: str | None = None, sample_every: int | None = None) -> None:
        self.core = CallbackCore(level, on_fault, capsule_dir, report_path, arch,
                                 hf_logging.get_logger("transformers.trainer"), sample_every)

    @property
    def report(self) -> Any:
        """The report of the first fault (same shape as ``watch().report()``); None on a clean run."""
        return self.core.report

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        self.core.start(model, optimizer, getattr(optimizer, "scaler", None))  # accelerate's GradScaler
        self._step = state.global_step
        self._loss_hook = model.register_forward_hook(self._loss_seen) if model is not None else None

    def _loss_seen(self, module: Any, args: Any, output: Any) -> None:
        import torch

        if module.training and torch.is_grad_enabled():  # training forwards, not evaluation
            self.core.losses.add(self._step, loss_of(output))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._step = state.global_step
        self.core.step_begin(state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.core.hidden_losses(self._hiders(args))
        if logs is not None:  # the forecast and warnings as scalars: to the loggers after this callback, and
            extra = self.core.early_warning()  # to trainer_state.json's log history
            logs.update(extra)
            if extra and state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(extra)

    def _hiders(self, args: Any) -> list[str]:
        why = []
        if getattr(args, "logging_nan_inf_filter", False):
            why.append("transformers' logging_nan_inf_filter (True by default) left it out of the logged 'loss', "
                       "which averages the finite steps instead: the logs look healthy; "
                       "TrainingArguments(logging_nan_inf_filter=False) logs it as it is")
        return why + self.core.scaler_phrase()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.core.step_end():
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        hook, self._loss_hook = getattr(self, "_loss_hook", None), None
        if hook is not None:
            hook.remove()
        self.core.hidden_losses(self._hiders(args))  # the steps after the last log
        self.core.end()
