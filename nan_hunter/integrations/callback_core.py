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

Under torch.distributed the report kept is each rank's own (``report()`` is a collective that
the other ranks would not join at that moment); ``report_path`` is written by every rank that saw
a fault.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import NonFiniteError
from ..report import Report, write_json
from ..session.fault_policy import OnFault, _verdict_line


def torch_optimizer(opt: Any) -> Any:
    """The ``torch.optim.Optimizer`` inside a framework's wrapper (accelerate's
    ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``)."""
    for _ in range(4):  # a wrapper may subclass Optimizer itself (accelerate's): the innermost one
        inner = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
        if inner is None or not hasattr(inner, "param_groups"):
            break
        opt = inner
    return opt if hasattr(opt, "register_step_pre_hook") else None


def as_report_v1(rep: Any) -> Report:
    """A watch report as JSON report v1 (``checkpoint`` and ``weights`` null: no checkpoint was read)."""
    return Report(run=rep.run, first_nonfinite=rep.first_nonfinite, diagnosis=rep.diagnosis, notes=list(rep.notes),
                  modules=rep.calls, mode="watch")


class CallbackCore:
    def __init__(self, level: str, on_fault: str, capsule_dir: str | None, report_path: str | None,
                 arch: str | None, logger: logging.Logger) -> None:
        self.kind = OnFault.parse(on_fault, has_optimizer=True)  # the framework's optimizer: checked at start
        self.level, self.on_fault = level, self.kind.value
        self.capsule_dir, self.report_path, self.arch = capsule_dir, report_path, arch
        self.logger = logger
        self.watch: Any = None
        self.report: Any = None

    def start(self, model: Any, optimizer: Any, scaler: Any = None) -> None:
        import nan_hunter

        if self.watch is not None:
            return
        opt = torch_optimizer(optimizer)
        mode = OnFault.STOP if self.kind.raises else self.kind  # raised here, outside the framework's hooks
        if mode.needs_optimizer and opt is None:
            raise ValueError("NanHunterCallback(on_fault='skip') needs the framework's optimizer; none was found")
        self.watch = nan_hunter.watch(model, level=self.level, backward=True, optimizer=opt, scaler=scaler,
                                      capsule_dir=self.capsule_dir, arch=self.arch, on_fault=mode.value)
        self.watch.__enter__()

    def step_begin(self, global_step: int) -> None:
        if self.watch is not None:
            self.watch.policy.step_label[self.watch.n_forwards] = int(global_step)

    def step_end(self) -> bool:
        """After a step: True when the framework should stop training."""
        w = self.watch
        if w is None or w.first_failed is None:
            return False
        if self.report is None:
            self.report = w.policy.local_report()
            self.logger.warning(_verdict_line(self.report))
            self._write()
            if self.kind.raises:
                self.end()
                raise NonFiniteError(self.report, _verdict_line(self.report))
        return self.kind.stops

    def _write(self) -> None:
        if self.report_path and self.report is not None:
            write_json(as_report_v1(self.report), self.report_path)

    def end(self) -> None:
        w, self.watch = self.watch, None
        if w is None:
            return
        w.__exit__(None, None, None)
        if self.report is not None and self.kind is OnFault.SKIP:
            self.report = w.policy.local_report()  # every skipped step, not only the first
            self._write()
