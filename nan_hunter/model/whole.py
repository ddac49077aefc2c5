"""A whole model and the failing step's inputs, for a fix checked on a fresh copy of the whole model
(contract v1.4 ``fix_verified.scope = "model"``).

``fresh(at)`` is the model as the user would load it at ``at``'s precision: a deep copy whose
floating weights are cast from ``master``, the weights at full precision — the checkpoint's as
loaded, before the run's cast (``prepare``); for a watch, the weights the failing step ran with —
never from weights already rounded to the run's dtype: bf16 of fp16-rounded weights is not what
loading the checkpoint in bf16 gives (the fix oracle found Qwen2's bf16 0.46 off fp32 from the
checkpoint, within tolerance from the fp16 copy). The user's model and inputs are never changed.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..dtypes import RunDtype
from ..tree import cast_floats, detached_copy
from .policy import set_precision

#: the largest model (weight bytes) copied whole for a fix check; bigger: the failing region only
COPY_LIMIT = 2 << 30


@dataclass
class WholeModel:
    """The model, the failing step's inputs (positional and keyword), and how its copies are made.

    ``master``: full-precision weights by ``state_dict()`` name (None: the model's own weights are
    what the user holds); ``training``: the copy's train/eval mode as the step ran; ``seed``: puts
    the RNG as the step had it (dropout masks) — the caller restores the user's RNG after; ``around``:
    a context each run of a copy is made in (a watch: compiled submodules run eagerly)."""

    model: nn.Module
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    master: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    training: bool = False
    seed: Callable[[], None] | None = field(default=None, repr=False)
    around: Callable[[], contextlib.AbstractContextManager] = field(
        default=contextlib.nullcontext, repr=False
    )

    def weights(self) -> dict[str, torch.Tensor]:
        """The full-precision weights copies are cast from (``master``, else the model's own)."""
        if self.master is not None:
            return {k: v for k, v in self.master.items() if v.is_floating_point()}
        return {k: v.detach() for k, v in self.model.state_dict().items() if v.is_floating_point()}

    def fresh(self, at: RunDtype) -> tuple[nn.Module, tuple, dict[str, Any]]:
        """A deep copy of the model with every floating weight cast from the full-precision weights to
        ``at``'s compute dtype, in the step's train/eval mode, and fresh copies of the inputs cast alike
        (integer tensors keep their dtype)."""
        m = copy.deepcopy(self.model)
        set_precision(m, at, {}, self.master)
        m.train(self.training)
        a, kw = cast_floats(detached_copy((self.args, self.kwargs)), at.torch_compute)
        return m, a, kw

    def call(self, m: nn.Module, args: tuple, kwargs: dict[str, Any]) -> Any:
        """``m`` run on ``args``/``kwargs`` with the step's RNG (``seed``) put in place first."""
        with self.around():
            if self.seed is not None:
                self.seed()
            return m(*args, **kwargs)


def master_of(model: nn.Module, run: RunDtype, limit: int) -> dict[str, torch.Tensor] | None:
    """The model's floating weights as they are now (before the run's cast), kept by reference — no
    copy: a cast gives the parameters new tensors — when the cast to ``run`` would change any of them
    and the model is small enough to be checked whole (``limit`` bytes); else None."""
    dt = run.torch_compute
    state = {k: v.detach() for k, v in model.state_dict().items() if v.is_floating_point()}
    if not any(v.dtype != dt for v in state.values()):
        return None
    if sum(v.numel() * v.element_size() for v in state.values()) > limit:
        return None
    return state
