"""Which mode a run's options ask for (the one place that maps options to a ``Mode``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .harness import Mode


def mode_for(generate: int | None = None, batch: bool = False, backward: bool = False,
             loss: str | None = None) -> Mode:
    """``--backward``: forward and backward of a loss; ``--generate N``: greedy decoding; else one
    forward per input. (``ScanOptions`` has already refused the combinations that cannot be.)"""
    if backward:
        from .backward import BackwardMode

        return BackwardMode(loss)
    if generate is not None:
        from .generate import GenerateMode

        return GenerateMode(generate, batch)
    from .forward import ForwardMode

    return ForwardMode()
