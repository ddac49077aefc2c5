"""Which mode a run's options ask for: a registry, the one place options are mapped to a ``Mode``.

Every mode that options select is one class with two class methods, ``wanted(request)`` (do these
options ask for me?) and ``from_request(request)`` (me, configured by them), and one line in
``MODES``. ``scan``, ``check`` and ``bisect`` all ask ``mode_for``; the first registered mode whose
``wanted`` holds runs (``ScanOptions`` and bisect have already refused the combinations that cannot
be). A capsule's step is not selected by options (the checkpoint is a capsule): ``CapsuleMode``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .backward import BackwardMode
from .forward import ForwardMode
from .generate import GenerateMode

if TYPE_CHECKING:  # pragma: no cover
    from .protocol import Mode


@dataclass(frozen=True)
class ModeRequest:
    """What a command's options ask of the harness."""

    generate: int | None = None  # --generate N: new tokens
    batch: bool = False  # --batch: the prompts as one padded batch
    backward: bool = False  # --backward
    loss: str | None = None  # --loss file.py:fn


class Selectable(Protocol):
    """A mode that options select."""

    @classmethod
    def wanted(cls, request: ModeRequest) -> bool: ...

    @classmethod
    def from_request(cls, request: ModeRequest) -> Mode: ...


#: most specific first; the last one (one forward per input) is wanted by any request
MODES: tuple[type[Selectable], ...] = (BackwardMode, GenerateMode, ForwardMode)


def mode_for(
    generate: int | None = None, batch: bool = False, backward: bool = False, loss: str | None = None
) -> Mode:
    """``--backward``: forward and backward of a loss; ``--generate N``: greedy decoding; else one
    forward per input."""
    request = ModeRequest(generate, batch, backward, loss)
    for cls in MODES:
        if cls.wanted(request):
            return cls.from_request(request)
    raise AssertionError(f"no registered mode for {request}")  # pragma: no cover - ForwardMode takes any
