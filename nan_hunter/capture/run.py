"""Running one input: one forward (or what a mode runs for one input) at a run's precision and grad
mode; a model's exception is bad input, a targeted re-run stopping early is not. The harness
(``modes.harness``) records inputs this way under capture."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..dtypes import RunDtype
from ..errors import BadInput
from ..model.execute import run_context
from .targeted import Captured


def forward(
    model: nn.Module,
    kwargs: dict[str, Any],
    run: RunDtype | None = None,
    step: Callable[[], Any] | None = None,
    grad: bool = False,
) -> Any:
    """One forward at ``run``'s precision (or ``step()``, what a mode runs for one input, under the
    same), without grad unless ``grad``; an exception inside the model is bad input."""
    try:
        with torch.set_grad_enabled(grad), run_context(run):
            return step() if step is not None else model(**kwargs)
    except (BadInput, Captured):  # a targeted re-run stopping early is not the model's failure
        raise
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        raise BadInput(
            f"the model raised {type(e).__name__} in {type(model).__name__}.forward(): {msg}; "
            "check that the inputs match what the model expects"
        ) from None
