"""What both framework callbacks do, without importing either framework.

The callback watches the framework's model with the optimizer (and GradScaler) the framework
created, at ``level`` (forward, backward and optimizer phases). Steps are named as the framework
counts them: the step a forward belongs to is the framework's global step when that step began
(``step_begin``), for ``first_nonfinite.step``, ``run.skipped_steps`` and the capsule's
``step-<k>``. At the first fault, at the end of the step that saw it (``step_end``): the report is
kept (``report``), written as JSON report v1 to ``report_path``, its verdict line logged to the
framework's logger; then ``"stop"`` asks the framework to stop, ``"raise"`` removes the hooks and
raises ``NonFiniteError``, ``"skip"`` has already undone that step's update and training goes on
(the report is read again at the end of training, with every skipped step). ``"stop"`` and
``"raise"`` undo that step's update too (the watch runs as ``"stop"`` with the framework's
optimizer): the model the user saves after training ends is the last good one. A clean run writes
nothing and changes nothing.

The log line names the report's path and the capsule's, with the command that replays it. A
framework that hides a non-finite loss (transformers' ``logging_nan_inf_filter``, a GradScaler
that skips the step without a word) is named with the steps it hid (``LossFlags``,
``hidden_losses``).

Under torch.distributed the report kept is each rank's own (``report()`` is a collective that
the other ranks would not join at that moment); ``report_path`` is written by every rank that saw
a fault.
"""

from __future__ import annotations

import shlex
from typing import Any

from ..errors import NonFiniteError
from ..report import write_json
from ..session.fault_policy import OnFault, verdict_line
from .early_warning import WarningLog, scalars
from .eval_loops import EvalLoops, WarningLogger


def torch_optimizer(opt: Any) -> Any:
    """The ``torch.optim.Optimizer`` inside a framework's wrapper (accelerate's
    ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``)."""
    for _ in range(4):  # a wrapper may subclass Optimizer itself (accelerate's): the innermost one
        inner = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
        if inner is None or not hasattr(inner, "param_groups"):
            break
        opt = inner
    return opt if hasattr(opt, "register_step_pre_hook") else None


class LossFlags:
    """Which framework steps computed a non-finite loss. Each loss becomes a device flag (no host
    synchronisation per step); the flags are read when the framework logs, which reads the loss
    then anyway (``new_bad_steps``)."""

    def __init__(self) -> None:
        self._pending: list[tuple[int, Any]] = []
        self._said: set[int] = set()

    def add(self, step: int, loss: Any) -> None:
        import torch

        if isinstance(loss, torch.Tensor) and loss.is_floating_point() and loss.numel():
            self._pending.append((step, torch.isfinite(loss.detach()).all().logical_not()))

    def new_bad_steps(self) -> list[int]:
        """Steps whose loss was non-finite, not yet returned by an earlier call."""
        bad = sorted({step for step, flag in self._pending if bool(flag)} - self._said)
        self._pending.clear()
        self._said.update(bad)
        return bad


def loss_of(output: Any) -> Any:
    """The loss in a model's output: ``output.loss`` (transformers' ``ModelOutput``), ``output["loss"]``
    (a dict, Lightning's ``training_step`` result) or the output itself when it is a tensor; None
    when there is none."""
    if isinstance(output, dict):
        return output.get("loss")
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    import torch

    return output if isinstance(output, torch.Tensor) and output.dim() == 0 else None


class CallbackCore:
    def __init__(
        self,
        level: str | None,
        on_fault: str,
        capsule_dir: str | None,
        report_path: str | None,
        arch: str | None,
        logger: WarningLogger,
        sample_every: int | None = None,
    ) -> None:
        self.kind = OnFault.parse(on_fault, has_optimizer=True)  # the framework's optimizer: checked at start
        self.level, self.on_fault = level, self.kind.value
        self.sample_every = (
            sample_every  # level "sentinel": blocks sampled every N-th step (None: the default)
        )
        self.capsule_dir, self.report_path, self.arch = capsule_dir, report_path, arch
        self.logger = logger
        self.watch: Any = None
        self.report: Any = None
        self.scaler: Any = None
        self.losses = LossFlags()
        self.eval = EvalLoops(logger)  # evaluation loops: run.eval, their own watch (integrations.eval_loops)
        self.warning_log = WarningLog()

    def early_warning(self) -> dict[str, float]:
        """At a framework's log step: the forecast and warnings as scalars for its loggers
        (``integrations.early_warning``); each new warning logged once, never a fault."""
        for line in self.warning_log.new_lines(self.watch):
            self.logger.warning(line)
        return scalars(self.watch)

    def start(self, model: Any, optimizer: Any, scaler: Any = None) -> None:
        import nan_hunter

        if self.watch is not None:
            return
        opt = torch_optimizer(optimizer)
        mode = OnFault.STOP if self.kind.raises else self.kind  # raised here, outside the framework's hooks
        if mode.needs_optimizer and opt is None:
            raise ValueError(
                "NanHunterCallback(on_fault='skip') needs the framework's optimizer; none was found"
            )
        self.scaler = scaler
        self.watch = nan_hunter.watch(
            model,
            level=self.level,
            sample_every=self.sample_every,
            backward=True,
            optimizer=opt,
            scaler=scaler,
            capsule_dir=self.capsule_dir,
            arch=self.arch,
            on_fault=mode.value,
        )
        self.watch.__enter__()

    def step_begin(self, global_step: int) -> None:
        if self.watch is not None:
            self.watch.label_step(global_step)

    def step_end(self) -> bool:
        """After a step: True when the framework should stop training."""
        w = self.watch
        if w is None or w.first_failed is None:
            return False
        if self.report is None:
            self.report = w.local_report()
            self._write()
            self.logger.warning(self.log_line())
            if self.kind.raises:
                self.end()
                raise NonFiniteError(self.report, verdict_line(self.report))
        return self.kind.stops

    def log_line(self) -> str:
        """The verdict line, then where the report and the capsule were written (and how to replay
        the capsule)."""
        parts = [verdict_line(self.report)]
        if self.report_path:
            parts.append(f"report: {self.report_path}")
        run = self.report.run
        capsule = run.get("capsule") if run is not None else None
        if capsule:
            parts.append(f"capsule: {capsule} (replay it with: nanhunter scan {shlex.quote(str(capsule))})")
        return " · ".join(parts)

    def hidden_losses(self, hidden_by: list[str]) -> None:
        """Say which steps' non-finite loss the framework hid, and how (``hidden_by``: the
        framework's mechanisms that hid it, as phrases), once per step; nothing when none did."""
        steps = self.losses.new_bad_steps()
        if steps and hidden_by:
            which = ", ".join(map(str, steps))
            self.logger.warning(
                f"nanhunter: the loss of step{'s' if len(steps) > 1 else ''} {which} was non-finite, "
                f"and {'; and '.join(hidden_by)}"
            )

    def scaler_phrase(self) -> list[str]:
        """The GradScaler's part in hiding a non-finite loss, when there is one."""
        if self.scaler is None:
            return []
        return [
            "the GradScaler skipped the optimizer step without a word (it only lowered its scale), so "
            "training went on as if nothing happened"
        ]

    def _write(self) -> None:
        if self.report_path and self.report is not None:
            write_json(self.report.as_report(), self.report_path)

    def eval_begin(self, model: Any, global_step: int | None) -> None:
        """An evaluation loop starts: training's watch paused, the eval watch on (attached now if it
        was not)."""
        self.eval.attach(model)
        self.eval.begin(global_step, self.watch)

    def eval_end(self, hidden_by: list[str] | None = None) -> None:
        """An evaluation loop ended: counted, its first failing step located, ``run.eval`` updated."""
        self.eval.end(hidden_by)
        self._eval_into_report()

    def _eval_into_report(self) -> None:
        if self.report is not None and self.report.run is not None:
            self.report.run["eval"] = self.eval.as_run()
            self._write()
        elif self.report_path and self.eval.report is not None:
            # training stayed finite, an evaluation did not: ``report_path`` gets the eval's report (its
            # ``run.eval`` counts every loop so far), so a job reading that file sees the NaN
            write_json(self.eval.report.as_report(), self.report_path)

    def end(self) -> None:
        w, self.watch = self.watch, None
        if w is None:
            return
        w.__exit__(None, None, None)
        if self.report is not None and self.kind is OnFault.SKIP:
            self.report = w.local_report()  # every skipped step, not only the first
            self._write()
        self._eval_into_report()
