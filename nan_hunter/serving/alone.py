"""One request of a packed batch run alone: the locate of a packed fault re-runs the origin
request by itself, from its own tokens, as a plain forward (no paged cache, no other request).

That is what ``replayed alone`` means in the report (contract v1.4, "Serving: packed batches"),
and why a watch's report after continuous batching is prompt: a packed forward's keywords hold
the whole paged KV cache (one tensor sized from free memory), which the generic re-run copied,
cast and scanned at every level (minutes, or out of memory). ``AloneRerun`` is the watch's
``Rerun`` with the failing step's inputs replaced by the request's tokens; everything else
(context, precision, weights) is the watch's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..capture.context import users_state_kept
from ..capture.snapshot import Snapshot
from ..locate.rerun import Rerun
from ..model.execute import run_context


def alone_inputs(tokens: list[int], device: torch.device) -> dict[str, Any]:
    """The keywords of a plain forward over ``tokens`` (positions from 0, no cache)."""
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    return {
        "input_ids": ids,
        "position_ids": torch.arange(len(tokens), device=device)[None],
        "use_cache": False,
    }


def run_alone(model: nn.Module, tokens: list[int], run: Any = None) -> torch.Tensor | None:
    """The logits of ``tokens`` run alone (copies of nothing: a new input), the model's state kept."""
    p = next(iter(model.parameters()), None)
    device = p.device if p is not None else torch.device("cpu")
    with users_state_kept(model), torch.no_grad(), run_context(run):
        out = model(**alone_inputs(tokens, device))
    t = getattr(out, "logits", None)
    if t is None and isinstance(out, (tuple, list)):
        t = out[0]
    return t if isinstance(t, torch.Tensor) else None


def fails_alone(model: nn.Module, tokens: list[int], run: Any = None) -> bool:
    """Whether ``tokens`` alone give a NaN or ±inf logit at their last position."""
    logits = run_alone(model, tokens, run)
    return logits is not None and not bool(torch.isfinite(logits[0, -1]).all())


class AloneRerun:
    """A watch's ``Rerun`` where step ``step`` is one request run alone over ``tokens``."""

    def __init__(self, base: Rerun, step: int, tokens: list[int]) -> None:
        self.base = base
        self.step = step
        self.tokens = list(tokens)
        self.model = base.model
        self.run = base.run

    def __getattr__(self, name: str) -> Any:  # context, weights, precision, optimizer, around, whole
        return getattr(self.base, name)

    def _device(self) -> torch.device:
        p = next(iter(self.model.parameters()), None)
        return p.device if p is not None else torch.device("cpu")

    def inputs(self, step: int) -> Snapshot | None:
        if step != self.step:
            return self.base.inputs(step)
        return Snapshot.of((), alone_inputs(self.tokens, self._device()))

    def forward(self, step: int) -> Callable[[], Any] | None:
        if step != self.step:
            return self.base.forward(step)
        snap = self.inputs(step)
        assert snap is not None
        ctx, model, run = self.base.context(step), self.model, self.run

        def rerun() -> Any:
            args, kwargs = snap.rerun()
            with contextlib.ExitStack() as stack:
                ctx.enter(stack)
                stack.enter_context(run_context(run))
                ctx.seed()
                return model(*args, **kwargs)

        return rerun

    def train(self, step: int) -> Callable[[], Any] | None:
        return None  # serving runs no backward
