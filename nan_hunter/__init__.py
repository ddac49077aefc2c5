"""nanhunter: find the first module and aten op that turned finite values into NaN/Inf.

Public API (torch is imported only when these are called):
``watch(model)``, ``scan(...)``, ``diff(a, b)``, ``apply_policy(model, policy)``, ``Report``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import NonFiniteError
from .version import __version__

__all__ = ["watch", "scan", "bisect", "diff", "apply_policy", "Report", "NonFiniteError", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from .report import Report
    from .session.watcher import Watch


def watch(model: Any, *, level: str = "blocks", retain: int = 4, backend: str | None = None, device: Any = None,
          dtype: str | None = None, fp8: Any = None, backward: bool = False, optimizer: Any = None,
          scaler: Any = None, capsule_dir: str | None = None, arch: str | None = None, on_fault: str = "record",
          trace: str | None = None, trace_level: str = "modules", **options: Any) -> Watch:
    """Watch ``model``: inside ``with nan_hunter.watch(model) as w:`` every module's forward is
    captured (fused statistics per output tensor, no host sync per hook on GPU); ``w.report()``
    then names the first module and aten op that produced NaN/Inf, replays it across dtypes,
    diagnoses it and checks the fix. ``print(w.report())`` shows it as ``nanhunter scan`` does;
    ``.to_html(path)`` / ``.to_json(path)`` write the same files.

    Args:
        model: the ``nn.Module`` to watch (also a ``torch.compile``d one, DDP or FSDP2).
        level: ``"blocks"`` (transformer blocks and the root, cheapest; a fault is refined to the
            leaf module on ``report()``) or ``"modules"`` (every module).
        retain: how many recent forwards to keep in full (older ones fold into aggregates).
        backend: statistics kernels, ``"triton"`` or ``"torch"`` (default: the best available).
        device: where statistics are kept (default: the model's device).
        dtype: the precision the model runs in (``fp16``, ``bf16``, ``fp8-e4m3``...; default: its
            parameters' dtype, or the autocast dtype of each forward).
        fp8: the fp8 emulation recipe (``dtypes.Fp8Recipe``) for fp8 dtypes.
        backward: also capture the backward (gradients per module).
        optimizer: the optimizer whose ``step()`` is captured (parameter updates).
        scaler: a ``torch.amp.GradScaler``; its own skipped steps are notes, not faults.
        capsule_dir: write ``DIR/step-<k>/`` (weights, batch, config) at the first fault, for
            ``nanhunter scan DIR/step-<k>`` on another machine.
        arch: ``"file.py:factory"`` recorded in the capsule for models that are not transformers.
        on_fault: ``"record"`` (run on), ``"raise"``, ``"skip"`` or ``"stop"`` (contract v1.2).
        trace: write a numerics trace (``nanhunter.trace/v1``, docs/trace-format.md) of every
            forward while watched, one step per root call, for ``nanhunter diff``; written as the
            steps end and closed when the watch ends.
        trace_level: ``"modules"`` (one entry per module call) or ``"ops"`` (per aten op).
        **options: further ``session.watcher.Watch`` options, passed on as they are.
    """
    from .session.watcher import Watch

    w = Watch(model, level=level, retain=retain, backend=backend, device=device, dtype=dtype, fp8=fp8,
              backward=backward, optimizer=optimizer, scaler=scaler, capsule_dir=capsule_dir, arch=arch,
              on_fault=on_fault, **options)
    w.collective = True  # under torch.distributed its report() is global (nan_hunter.distributed.global_report); the CLI's stay per rank
    if trace is not None:
        from .trace.recorder import TraceRecorder

        w.add_companion(TraceRecorder(model, trace, trace_level, dtype=w.run.name if w.run is not None else None,
                                      paused=lambda: w.paused))
    return w


def scan(checkpoint: str, **options: Any) -> Report:
    """The ``nanhunter scan`` pipeline as a function; returns the Report. Options take the flags'
    names; a repeatable one (``prompts``, ``inputs``, ``max_memory``) takes a list, or one string
    as one item: ``prompts="hello"`` is one prompt."""
    from .pipeline.scan_checkpoint import scan as _scan

    return _scan(checkpoint, **options)


def diff(a: str, b: str, *, rtol: float | None = None) -> Any:
    """``nanhunter diff A B`` as a function: where two traces (``scan(..., trace=PATH)``,
    ``watch(model, trace=PATH)``) part. Returns a ``divergence.compare.DiffResult``
    (``.first_divergence``, ``.exit_code``, ``.to_dict()`` is ``nanhunter.diff/v1``); raises
    ``BadInput`` for files that cannot be compared."""
    from .divergence.compare import compare_traces
    from .trace.reader import read_trace

    return compare_traces(read_trace(a), read_trace(b), rtol)


def bisect(checkpoint: str, **options: Any) -> Report:
    """The ``nanhunter bisect`` pipeline as a function; returns the Report (``prompts="hello"`` is
    one prompt, as in ``scan``)."""
    from .bisection.runner import bisect as _bisect

    return _bisect(checkpoint, **options)


def apply_policy(model: Any, policy: Any) -> Any:
    """Make the modules a bisect policy lists compute in their kept dtype."""
    from .model.policy import apply_policy as _apply

    return _apply(model, policy)


def __getattr__(name: str) -> Any:
    if name == "Report":
        from .report import Report

        return Report
    raise AttributeError(name)
