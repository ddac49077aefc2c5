"""nanhunter: find the first module and aten op that turned finite values into NaN/Inf.

Public API (torch is imported only when these are called):
``watch(model)``, ``scan(...)``, ``apply_policy(model, policy)``, ``Report``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import NonFiniteError
from .version import __version__

__all__ = ["watch", "scan", "bisect", "apply_policy", "Report", "NonFiniteError", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from .report import Report


def watch(model: Any, **options: Any):
    """Context manager capturing every module's forward; see ``nan_hunter.session.watcher.Watch``."""
    from .session.watcher import Watch

    w = Watch(model, **options)
    w.collective = True  # under torch.distributed its report() is global (nan_hunter.distributed.global_report); the CLI's stay per rank
    return w


def scan(checkpoint: str, **options: Any) -> Report:
    """The ``nanhunter scan`` pipeline as a function; returns the Report."""
    from .pipeline.scan_checkpoint import scan as _scan

    return _scan(checkpoint, **options)


def bisect(checkpoint: str, **options: Any) -> Report:
    """The ``nanhunter bisect`` pipeline as a function; returns the Report."""
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
