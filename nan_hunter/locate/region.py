"""The failing region a located fault names, ready to be run again by ``explain`` (the replay in
every dtype and, for a forward fault, the fix check): what was called and what it was given.

- ``Region``: a forward fault's module call, with copies of its inputs; ``whole`` is the model and
  the failing input (``model.whole.WholeModel``) when the fix may be checked on a copy of the whole model; ``around`` puts the
  module's weights in place while it runs (``--device-map`` offload).
- ``BackwardRegion``: a backward fault's module call, its inputs and the gradients that reached
  its outputs.
- ``OptimizerRegion``: one parameter's optimizer step as it was before it ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..model.whole import WholeModel
from .training_phases import OptimizerPieces


@dataclass
class Region:
    """The failing forward call: the module and the inputs it was called with (captured copies)."""

    name: str
    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: the model, the failing input and its full-precision weights: the fix may be checked on a fresh
    #: copy of the whole model (``model.whole``)
    whole: WholeModel | None = field(default=None, repr=False)
    #: a context that puts the module's weights in place while it runs (``--device-map`` offload)
    around: Callable[[], contextlib.AbstractContextManager[object]] = field(
        default=contextlib.nullcontext, repr=False
    )


@dataclass
class BackwardRegion:
    """The failing backward call: the module, its inputs and the gradients at its outputs (None for
    an output no gradient reached)."""

    name: str
    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grads: list[Any]
    around: Callable[[], contextlib.AbstractContextManager[object]] = field(
        default=contextlib.nullcontext, repr=False
    )


@dataclass
class OptimizerRegion:
    """One parameter's optimizer step, from its value, gradient and state before the step."""

    param: str
    pieces: OptimizerPieces
    around: Callable[[], contextlib.AbstractContextManager[object]] = field(
        default=contextlib.nullcontext, repr=False
    )


AnyRegion = Region | BackwardRegion | OptimizerRegion
