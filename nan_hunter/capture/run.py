"""Running a model under capture: one no-grad forward at a run's precision (a model's exception is
bad input; a targeted re-run stopping early is not), and every batch of a data set recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..dtypes import RunDtype
from ..errors import BadInput
from ..model.execute import run_context
from .recorder import Recorder
from .targeted import Captured


def forward(model: nn.Module, kwargs: dict[str, Any], run: RunDtype | None = None,
            step: Callable[[], Any] | None = None) -> Any:
    """One no-grad forward at ``run``'s precision (or ``step()``, what a mode runs for one input,
    under the same); an exception inside the model is bad input."""
    try:
        with torch.no_grad(), run_context(run):
            return step() if step is not None else model(**kwargs)
    except (BadInput, Captured):  # a targeted re-run stopping early is not the model's failure
        raise
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        raise BadInput(f"the model raised {type(e).__name__} in {type(model).__name__}.forward(): {msg}; "
                       "check that the inputs match what the model expects") from None


def capture_run(model: nn.Module, batches: list[dict[str, Any]], level: str = "modules",
                run: RunDtype | None = None,
                run_input: Callable[[nn.Module, dict[str, Any], Recorder], Any] | None = None) -> Recorder:
    """Every batch through the model once (``run_input(model, kwargs, recorder)``: what a mode runs
    for one input; default one forward), recorded at ``level``."""
    rec = Recorder(model, level=level, retain=len(batches))
    with rec:
        for kw in batches:
            forward(model, kw, run, None if run_input is None else lambda kw=kw: run_input(model, kw, rec))
    return rec
