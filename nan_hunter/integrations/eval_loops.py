"""Evaluation and validation loops, watched beside training (contract v1.4 ``run.eval``).

Both callbacks hand their framework's evaluation loops to one ``EvalLoops``: while a loop runs,
the training watch is paused (an eval forward is not a training step: it is not counted, and it
triggers no ``on_fault``) and a second watch, at level ``"sentinel"``, judges every eval step's
outputs. At the end of a loop the non-finite losses are counted and the first failing eval step is
located like a training fault (the sentinel replays it in full: module, op, cause), once per run.

Counting (``nonfinite_losses``): every loss value the framework saw, each element judged — one per
eval step for a scalar loss (transformers' ``output.loss``: the mean over the batch's tokens, so
with ``per_device_eval_batch_size=1`` one per sample), one per sample when the loss has a batch
dimension (a Lightning ``validation_step`` returning per-sample losses). ``first_failed``: the
first eval step (counted from 0 over every loop of the run) whose loss or outputs were non-finite.

Why no ``on_fault`` for evaluation: an eval step updates nothing, so there is no step to undo, and
stopping training on a bad validation sample would punish the weights for the data; the verdict is
logged, kept (``report``) and written into the training report's ``run.eval`` too. The eval's
results are untouched: the hooks only read, the inputs kept are copies, re-runs happen after the
loop on copies, with the user's RNG and modes put back.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..session.fault_policy import verdict_line


class WarningLogger(Protocol):
    """What the callbacks need of their framework's logger: a ``logging.Logger``, or transformers'
    (typed by transformers as a protocol of its own)."""

    def warning(self, msg: str) -> None: ...


class EvalLoops:
    """The evaluation loops of one training run (or of a ``Trainer``'s ``evaluate()`` calls)."""

    def __init__(self, logger: WarningLogger, sample_every: int | None = 0) -> None:
        self.logger = logger
        self.watch: Any = None  # a sentinel watch of the model, paused outside evaluation loops
        self.active = False
        self.steps = 0
        self.nonfinite_losses = 0
        self.first_failed: int | None = None  # eval step
        self.at_step: int | None = None  # the training step the loop of the first failure ran after
        self.report: Any = None  # the WatchReport of the first failing eval step
        self._pending: list[tuple[int, Any]] = []  # (eval step, device count of non-finite loss elements)
        self._loop_start = 0
        self._paused: Any = None  # the training watch paused by this loop, and its state before
        self._global_step: int | None = None
        self._base = 0
        self.sample_every = sample_every

    def attach(self, model: Any) -> None:
        """Hook ``model`` (its root only), paused until a loop begins."""
        import nan_hunter

        if self.watch is not None or model is None:
            return
        self._base = self.steps  # eval steps counted by earlier watches: this one's step 0 is eval step _base
        self.watch = nan_hunter.watch(
            model, level="sentinel", sample_every=0, backward=False, on_fault="record"
        )
        self.watch.__enter__()
        self.watch.paused = True

    def begin(self, global_step: int | None, training_watch: Any = None) -> None:
        """An evaluation loop starts (after training step ``global_step``, None outside training)."""
        if self.active or self.watch is None:
            return
        self.active = True
        self._global_step = global_step
        self._loop_start = self.watch.n_forwards
        if training_watch is not None and not training_watch.paused:
            training_watch.paused = True
            self._paused = training_watch
        self.watch.paused = False

    def loss(self, loss: Any) -> None:
        """A loss of the eval step running now: its non-finite elements, as a device count (read at
        the end of the loop, no host synchronisation per step). Not while the eval watch re-runs a
        step for its report (it is paused then)."""
        import torch

        if (
            self.active
            and not self.watch.paused
            and isinstance(loss, torch.Tensor)
            and loss.is_floating_point()
            and loss.numel()
        ):
            self._pending.append(
                (self._base + self.watch.n_forwards - 1, torch.isfinite(loss.detach()).logical_not().sum())
            )

    def end(self, hidden_by: list[str] | None = None) -> None:
        """The loop ended: count, locate the first failing eval step (once per run), log, and give
        training back its watch. ``hidden_by``: what in the framework hid this loop's non-finite
        losses (phrases, said when there were some)."""
        if not self.active:
            return
        try:
            w = self.watch
            n = w.n_forwards - self._loop_start
            self.steps += n
            bad = [step for step, c in self._pending if int(c)]
            new = sum(int(c) for _, c in self._pending)
            self._pending.clear()
            self.nonfinite_losses += new
            w.poll_flags(wait=True)
            faulted = w.first_failed is not None and w.first_failed >= self._loop_start
            failed_now = bad[:1] + ([self._base + w.first_failed] if faulted else [])
            first_here = self.first_failed is None and bool(failed_now)
            if first_here:
                self.first_failed = min(failed_now)
                self.at_step = self._global_step
                if faulted:
                    w.label_step(self._base + w.first_failed, w.first_failed)  # steps over every loop
                    # the sentinel replays the failing eval step in full; this rank's own report (under
                    # torch.distributed the global one is a collective the other ranks would not join)
                    self.report = w.local_report()
                    self.report.run["eval"] = self.as_run()
            if self.report is not None and self.report.run is not None:
                self.report.run["eval"] = self.as_run()  # the counts over every loop so far, not the first's
            if new or faulted:
                self.logger.warning(self._line(n, new, first_here, hidden_by or []))
        finally:
            self.watch.paused = True
            self.active = False
            if self._paused is not None:
                self._paused.paused = False
                self._paused = None

    def _line(self, n: int, new: int, first_here: bool, hidden_by: list[str]) -> str:
        after = f" after training step {self._global_step}" if self._global_step is not None else ""
        parts = [f"nanhunter: evaluation{after}: {new} non-finite eval loss value(s) in {n} eval step(s)"]
        if first_here:
            parts.append(f"first at eval step {self.first_failed}")
            parts.append(
                verdict_line(self.report)
                if self.report is not None
                else "not located: the model's outputs were finite (the loss was computed outside its forward)"
            )
        return " · ".join(parts + (hidden_by if new else []))

    def as_run(self) -> dict[str, Any] | None:
        """``run.eval``: null when no evaluation ran."""
        if self.steps == 0 and not self.active:
            return None
        out: dict[str, Any] = {
            "steps": self.steps,
            "nonfinite_losses": self.nonfinite_losses,
            "first_failed": self.first_failed,
            "after_step": self.at_step,
            "module": None,
            "op": None,
            "cause": None,
        }
        rep = self.report
        if rep is not None and rep.first_nonfinite is not None:
            out["module"], out["op"] = rep.first_nonfinite.module, rep.first_nonfinite.op
            out["cause"] = rep.diagnosis.cause if rep.diagnosis is not None else None
        return out

    def detach(self) -> None:
        self.end()
        w, self.watch = self.watch, None
        if w is not None:
            w.__exit__(None, None, None)
