"""``nan_hunter.watch(model)``: a recording session that owns ``report()``.

Capture (``capture.Recorder``) records calls and rows; this module turns them into a report:
the producer rule over the records (``locate.producer``), then — for the failing forward, from
its retained inputs — a module-level re-run when the capture was at block level, and the op-level
re-run (``locate.first_op``). Re-runs happen at the watch's precision (the one dtype rule: fp8
watches re-run under fp8 emulation) and under the autocast and grad mode the forward ran in, on
copies of the retained inputs, so a report never changes the user's model, cache or inputs.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from .capture.ops import OpEvent
from .capture.recorder import Recorder
from .dtypes import RunDtype
from .execute import run_context
from .locate.first_op import locate_op
from .locate.producer import call_table, failed_inputs, first_finding, mask_notes, to_first_nonfinite
from .report import FirstNonfinite
from .tree import detached_copy


@dataclass
class WatchReport:
    """What ``watch(...).report()`` returns: the first non-finite value and per-call stats."""

    first_nonfinite: FirstNonfinite | None
    calls: list[dict[str, Any]]
    failed_inputs: list[int]
    notes: list[str] = field(default_factory=list)
    op_event: OpEvent | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"first_nonfinite": asdict(self.first_nonfinite) if self.first_nonfinite else None,
                "modules": self.calls, "failed_inputs": self.failed_inputs, "notes": self.notes}


@dataclass(frozen=True)
class ForwardContext:
    """The ambient state a forward ran under, so a re-run can be made under the same."""

    grad: bool
    autocast: tuple[tuple[str, torch.dtype], ...]  # (device type, dtype) for each enabled autocast

    @classmethod
    def now(cls) -> ForwardContext:
        amp = []
        for dev in ("cpu", "cuda"):
            try:
                if torch.is_autocast_enabled(dev):
                    amp.append((dev, torch.get_autocast_dtype(dev)))
            except (RuntimeError, TypeError):  # a device type this build does not know
                continue
        return cls(torch.is_grad_enabled(), tuple(amp))

    def enter(self, stack: contextlib.ExitStack) -> None:
        stack.enter_context(torch.no_grad())  # re-runs never build graphs on the user's tensors
        for dev, dt in self.autocast:
            stack.enter_context(torch.autocast(dev, dtype=dt))


class Watch(Recorder):
    """Capture per-module statistics while the model runs; ``report()`` locates the first NaN/Inf.

    ``dtype``: the precision the model runs in (``"fp8-e4m3"`` makes re-runs emulate fp8 as the
    forward did); default: as the model is."""

    def __init__(self, model: nn.Module, level: str = "blocks", retain: int = 4, backend: str | None = None,
                 device: Any = None, dtype: str | RunDtype | None = None, fp8: Any = None):
        super().__init__(model, level=level, retain=retain, backend=backend, device=device)
        self.run = dtype if isinstance(dtype, RunDtype) or dtype is None else RunDtype.of(dtype, fp8)
        self.contexts: dict[int, ForwardContext] = {}
        self._report: WatchReport | None = None

    def _on_root_call(self, forward: int) -> None:
        self.contexts[forward] = ForwardContext.now()
        for old in [k for k in self.contexts if k < forward - self.retain]:
            del self.contexts[old]

    def report(self) -> WatchReport:
        """Locate the first non-finite value (re-running retained inputs at finer levels when
        the capture was at block level) and return a ``WatchReport``."""
        if self._report is None or self.sink.graph_rows:
            # rows written by a captured CUDA graph change with every replay: read them again
            self.sink.refresh()
            self._report = self._locate()
        return self._report

    def _locate(self) -> WatchReport:
        rows = self.sink.rows()
        finding = first_finding(self.calls, rows)
        notes = mask_notes(self.calls, rows)
        failed = failed_inputs(self.calls, rows)
        if finding is not None:
            retained = {i: (a, k) for i, a, k in self.retained}
            idx = finding.call.input_index
            missing = f"op-level location{' and module-level location' if self.level == 'blocks' else ''}"
            if idx in retained and self.weights_changed_since(idx):
                notes.append(f"parameters changed in place after forward {idx} (an optimizer step?): it was not "
                             f"re-run, since a re-run would use the new weights, so the {missing} is missing; "
                             "call report() before the weights change to get them")
            elif idx in retained:
                args, kwargs = retained[idx]
                fine = self._refine(args, kwargs, idx)
                if fine is not None:
                    fine.failed_inputs = sorted(set(failed) | set(fine.failed_inputs))
                    return fine
                notes.append(f"re-running forward {idx} did not reproduce the non-finite value (a nondeterministic "
                             "op, or inputs changed in place since?), so this location comes from the capture alone")
            else:
                notes.append(f"inputs of forward {idx} were not retained (retain={self.retain}), so the {missing} "
                             "is missing")
        fnf = to_first_nonfinite(finding) if finding else None
        return WatchReport(fnf, call_table(self.calls, rows), failed, notes)

    def _refine(self, args: tuple, kwargs: dict, input_index: int) -> WatchReport | None:
        """Module- then op-level location for one retained forward, on copies of its inputs,
        under the precision and ambient context that forward ran in."""
        ctx = self.contexts.get(input_index, ForwardContext(False, ()))

        def rerun() -> Any:
            with contextlib.ExitStack() as stack:
                ctx.enter(stack)
                stack.enter_context(run_context(self.run))
                return self.model(*detached_copy(args), **detached_copy(kwargs))

        fine = Recorder(self.model, level="modules", retain=1, device=self.sink.device)
        fine._forward = input_index - 1
        with fine:
            rerun()
        rows = fine.sink.rows()
        f = first_finding(fine.calls, rows)
        if f is None:
            return None
        with contextlib.ExitStack() as stack:
            ctx.enter(stack)
            ev, _, _, _ = locate_op(self.model, rerun, f, self.run)
        return WatchReport(to_first_nonfinite(f, ev), call_table(fine.calls, rows), failed_inputs(fine.calls, rows),
                           mask_notes(fine.calls, rows), ev)
