"""What a watch records and does (``nan_hunter.watch``, the framework callbacks): one frozen object,
every option checked once, at construction, with the reason (``ValueError``: the Python API's
error for a bad argument); the watch, its recorder, its fault policy and its trace read the
checked values and never check them again."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..capture.recorder import LEVELS
from ..dtypes import RunDtype, UnknownDtype
from ..trace.recorder import LEVELS as TRACE_LEVELS
from .fault_policy import OnFault

#: the sentinel's default sampling period: one step in a hundred at level "blocks" keeps the
#: average cost within 1 % of the sentinel's (a blocks step costs at most ~1.3x a plain one)
SAMPLE_EVERY = 100


def default_level() -> str:
    """``"sentinel"`` (contract v1.4), except under an initialised torch.distributed group, where it
    stays ``"blocks"``: a sentinel replay re-runs the failing step from the weights kept for it, and
    sharded (FSDP2) parameters cannot be copied mid-step, nor can a one-rank transient be placed on
    its block without the per-block record (docs/distributed.md)."""
    import sys

    dist = sys.modules.get("torch.distributed")  # not imported: no group can be open
    if dist is not None and dist.is_available() and dist.is_initialized():
        return "blocks"
    return "sentinel"


@dataclass(frozen=True)
class WatchOptions:
    """A watch's options, validated (``nan_hunter.watch``'s docstring says what each does)."""

    level: str | None = None  # sentinel | blocks | modules | ops; None: default_level()
    sample_every: int | None = (
        None  # sentinel: full block statistics every N-th step; 0: never; None: SAMPLE_EVERY
    )
    retain: int = 4  # forwards kept in full besides the first failing one
    backend: str | None = (
        None  # triton | reference; None: Triton on a GPU when installed (checked with the device)
    )
    device: Any = None  # where statistics are kept; None: the model's device
    dtype: RunDtype | str | None = None  # the precision the model runs in (a RunDtype after checking)
    fp8: Any = None  # the fp8 emulation recipe (dtypes.Fp8Recipe) of the fp8 dtypes
    backward: bool = False  # capture the backward pass too
    optimizer: Any = None  # the optimizer whose step() is captured
    scaler: Any = None  # the GradScaler in use
    capsule_dir: str | None = None  # write DIR/step-<k>/ at the first fault
    arch: str | None = None  # "file.py:factory" recorded in the capsule
    on_fault: OnFault | str = (
        OnFault.RECORD
    )  # record | raise | skip | stop | abort (an OnFault after checking)
    trace: str | None = None  # write a numerics trace here
    trace_level: str = "modules"  # modules | ops
    # under torch.distributed, report() is global (a collective every rank joins: distributed.global_report);
    # nan_hunter.watch() sets it, the CLI's own watches stay per rank
    collective: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.level is None:
            set_(self, "level", default_level())
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {self.level!r}")
        if self.sample_every is None:
            set_(self, "sample_every", SAMPLE_EVERY if self.level == "sentinel" else 0)
        if (
            isinstance(self.sample_every, bool)
            or not isinstance(self.sample_every, int)
            or self.sample_every < 0
        ):
            raise ValueError(
                f"sample_every must be a number of steps (an integer ≥ 0; 0: never), "
                f"got {self.sample_every!r}"
            )
        if self.sample_every and self.level != "sentinel":
            raise ValueError(
                f"sample_every samples steps of level 'sentinel'; level {self.level!r} records every "
                "step in full already"
            )
        if isinstance(self.retain, bool) or not isinstance(self.retain, int) or self.retain < 0:
            raise ValueError(f"retain must be a number of forwards (an integer ≥ 0), got {self.retain!r}")
        if self.dtype is not None and not isinstance(self.dtype, RunDtype):
            try:
                set_(self, "dtype", RunDtype.of(self.dtype, self.fp8))
            except (UnknownDtype, AttributeError) as e:
                raise ValueError(str(e)) from None
        set_(self, "on_fault", OnFault.parse(self.on_fault, self.optimizer is not None))
        for name in ("capsule_dir", "arch", "trace"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, (str, os.PathLike)):
                raise ValueError(f"{name} must be a path (a str), got {type(v).__name__}")
        if self.trace_level not in TRACE_LEVELS:
            raise ValueError(f"trace_level must be one of {TRACE_LEVELS}, got {self.trace_level!r}")
        if not isinstance(self.collective, bool):
            raise ValueError(f"collective must be True or False, got {self.collective!r}")

    @property
    def run(self) -> RunDtype | None:
        """The precision the model runs in (None: as the model is)."""
        return self.dtype if isinstance(self.dtype, RunDtype) else None

    @property
    def policy(self) -> OnFault:
        return self.on_fault if isinstance(self.on_fault, OnFault) else OnFault(self.on_fault)
