"""``lightning.Trainer(callbacks=[NanHunterCallback()])`` (and ``pytorch_lightning``): watch the
LightningModule with the optimizer (and GradScaler) the Trainer creates; stop
(``trainer.should_stop``), skip or raise at the first fault (``integrations.callback_core``).
``first_nonfinite.step`` is ``trainer.global_step`` when the failing batch began. The watch's root
is the LightningModule: its ``training_step`` calls ``self(...)`` (its ``forward``).

What hides a non-finite loss under Lightning: mixed precision (``precision="16-mixed"``) steps
through a GradScaler, which skips the optimizer step of a NaN/Inf loss without a word and goes
on; and ``ModelCheckpoint(monitor=...)`` ranks a NaN monitored value as ±inf. The callback reads
each ``training_step`` loss (as a device flag, read when Lightning logs) and names the steps.

Validation is watched too (``integrations.eval_loops``, ``run.eval``): every validation loop
(the sanity check's, those during ``fit`` and ``trainer.validate()``), between
``on_validation_start`` and ``on_validation_end``; the loss counted is what ``validation_step``
returns (a tensor, or ``{"loss": ...}``; a per-sample vector is counted per sample)."""

from __future__ import annotations

import logging
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]  # the same class, packaged apart

from torch import Tensor

from .callback_core import CallbackCore, loss_of


def _scaler(trainer: Any) -> Any:
    plugin = getattr(trainer, "precision_plugin", None) or getattr(trainer.strategy, "precision_plugin", None)
    return getattr(plugin, "scaler", None)


class NanHunterCallback(Callback):
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
            logging.getLogger("lightning.pytorch"),
            sample_every,
        )

    @property
    def report(self) -> Any:
        """The report of the first fault (same shape as ``watch().report()``); None on a clean run."""
        return self.core.report

    @property
    def eval_report(self) -> Any:
        """The report of the first failing validation step (located like a training fault,
        ``run.eval`` filled); None when every validation step was finite."""
        return self.core.eval.report

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.core.eval_begin(pl_module, None if trainer.sanity_checking else trainer.global_step)

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.core.eval.loss(
            outputs if isinstance(outputs, Tensor) else loss_of(outputs)
        )  # per-sample: a vector

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.core.eval_end()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.core.eval.detach()  # the end of fit, validate or test: the validation hooks go

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        opts = list(getattr(trainer, "optimizers", []) or [])
        self.core.start(pl_module, opts[0] if opts else None, _scaler(trainer))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._current = trainer.global_step
        self.core.step_begin(trainer.global_step)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.core.losses.add(getattr(self, "_current", trainer.global_step), loss_of(outputs))
        if self.core.step_end():
            trainer.should_stop = True
        every = getattr(trainer, "log_every_n_steps", 50) or 50
        if (batch_idx + 1) % every == 0:  # Lightning reads the loss to log it now anyway
            self.core.hidden_losses(self._hiders(trainer))
            extra = self.core.early_warning()  # the forecast and warnings as scalars
            if extra and getattr(trainer, "logger", None) is not None:
                trainer.logger.log_metrics(extra, step=trainer.global_step)

    def _hiders(self, trainer: Any) -> list[str]:
        why = self.core.scaler_phrase()
        for cb in getattr(trainer, "callbacks", []) or []:
            monitor = getattr(cb, "monitor", None)
            if type(cb).__name__ == "ModelCheckpoint" and monitor and "loss" in monitor:
                why.append(
                    f"ModelCheckpoint(monitor={monitor!r}) ranks a NaN {monitor} as ±inf: the checkpoints "
                    "it keeps do not show it"
                )
        return why

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.core.hidden_losses(self._hiders(trainer))  # the steps after the last log
        self.core.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.core.end()
        self.core.eval.detach()  # the hooks are removed whatever happened
