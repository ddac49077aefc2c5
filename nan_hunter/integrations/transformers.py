"""``transformers.Trainer(..., callbacks=[NanHunterCallback()])``: watch the Trainer's model with
the optimizer (and GradScaler) the Trainer creates; stop, skip or raise at the first fault
(``integrations.callback_core``). ``first_nonfinite.step`` is ``state.global_step`` when the failing
step began.

The Trainer's own trap: with ``logging_nan_inf_filter=True`` (its default) a step whose loss is
NaN or Inf is left out of the logged ``loss``, which then averages the finite steps — the curve
looks healthy. The callback reads the loss of each training forward (``output.loss``, as a device
flag) and, when the Trainer logs, names the steps the filter hid.

Evaluation is watched too (``integrations.eval_loops``, ``run.eval``): ``evaluate()`` and
``predict()``, during training or on their own. The Trainer has no event before an evaluation
loop, so the callback keeps a paused sentinel watch and a gate (a forward pre-hook that runs
first) on the model from ``on_init_end`` (or ``on_train_begin``): the first forward in eval mode
opens the loop, ``on_evaluate``/``on_predict`` closes it. When training ends every hook goes (the
model is left as it was: it can be pickled, compiled, saved); ``evaluate()`` after ``train()`` is
watched again after ``callback.watch_evaluation(trainer.model)``, and ``close()`` removes the
hooks of a Trainer that never trains. Since transformers 5, ``logging_nan_inf_filter`` also leaves
non-finite eval losses out of ``eval_loss`` (the mean of the finite ones); the callback counts
them and says so."""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from .callback_core import CallbackCore, loss_of


class NanHunterCallback(TrainerCallback):
    def __init__(
        self,
        level: str | None = None,
        on_fault: str = "stop",
        capsule_dir: str | None = None,
        report_path: str | None = None,
        arch: str | None = None,
        sample_every: int | None = None,
    ) -> None:
        self.core = CallbackCore(
            level,
            on_fault,
            capsule_dir,
            report_path,
            arch,
            hf_logging.get_logger("transformers.trainer"),
            sample_every,
        )
        self._eval_hooks: list[Any] = []  # the evaluation gate and loss hook (watch_evaluation)
        self._training = False  # between on_train_begin and on_train_end
        self._step = self._done = 0  # the step running (begun) and the steps done

    @property
    def report(self) -> Any:
        """The report of the first fault (same shape as ``watch().report()``); None on a clean run."""
        return self.core.report

    @property
    def eval_report(self) -> Any:
        """The report of the first failing eval step (located like a training fault, ``run.eval``
        filled); None when every eval step was finite."""
        return self.core.eval.report

    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.watch_evaluation(model)

    def watch_evaluation(self, model: Any) -> None:
        """Watch the evaluation loops of ``model`` (the Trainer's): done at the Trainer's start;
        again, after ``train()`` ended, for ``evaluate()``/``predict()`` calls after it."""
        if model is None or self._eval_hooks:
            return
        self.core.eval.attach(model)
        self._eval_hooks = [
            model.register_forward_pre_hook(self._eval_gate, prepend=True),
            model.register_forward_hook(self._eval_loss),
        ]

    def _eval_gate(self, module: Any, args: Any) -> None:
        if not module.training and not self.core.eval.active:  # evaluation_loop called model.eval()
            self.core.eval_begin(module, self._done if self._training else None)
        elif module.training and self.core.eval.active:  # an eval-mode forward outside evaluate() (a user's
            self.core.eval_end()  # own generation): training is watched again at its next forward

    def _eval_loss(self, module: Any, args: Any, output: Any) -> None:
        if self.core.eval.active:
            self.core.eval.loss(loss_of(output))

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self.core.eval_end(self._eval_hiders(args, metrics))

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self.core.eval_end(self._eval_hiders(args, metrics))

    def _eval_hiders(self, args: Any, metrics: Any) -> list[str]:
        """The filter, named when it hid something: the loop's loss metric is finite (transformers 5
        filters eval losses; 4.x reports a NaN ``eval_loss`` as it is). Said only when the loop had
        non-finite losses (``EvalLoops.end``)."""
        loss = next((v for k, v in (metrics or {}).items() if k.endswith("_loss")), None)
        if (
            not getattr(args, "logging_nan_inf_filter", False)
            or not isinstance(loss, float)
            or not math.isfinite(loss)
        ):
            return []
        return [
            "transformers' logging_nan_inf_filter (True by default) leaves non-finite eval losses out of "
            "'eval_loss', which then averages the finite ones (transformers 5; TrainingArguments("
            "logging_nan_inf_filter=False) keeps them)"
        ]

    def close(self) -> None:
        """Remove the evaluation hooks (the training watch is removed when training ends)."""
        for h in self._eval_hooks:
            h.remove()
        self._eval_hooks = []
        self.core.eval.detach()

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        self.watch_evaluation(model)  # a model from model_init: not there at on_init_end
        self.core.start(model, optimizer, getattr(optimizer, "scaler", None))  # accelerate's GradScaler
        self._step, self._done, self._training = state.global_step, state.global_step, True
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
            why.append(
                "transformers' logging_nan_inf_filter (True by default) left it out of the logged 'loss', "
                "which averages the finite steps instead: the logs look healthy; "
                "TrainingArguments(logging_nan_inf_filter=False) logs it as it is"
            )
        return why + self.core.scaler_phrase()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._done = (
            state.global_step
        )  # steps done: what an evaluation after it ran after (run.eval.after_step)
        if self.core.step_end():
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        hook, self._loss_hook = getattr(self, "_loss_hook", None), None
        if hook is not None:
            hook.remove()
        self.core.hidden_losses(self._hiders(args))  # the steps after the last log
        self._training = False
        self.core.end()
        self.close()  # the model is left without hooks (run.eval stays in the report)
