"""Running a model at a run's precision: the device, casting by the one dtype rule
(``dtypes.RunDtype``), forwards under capture, and re-runs that copy one module call's inputs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..capture.recorder import Recorder
from ..capture.targeted import Captured
from ..dtypes import RunDtype
from ..errors import BadInput
from ..tree import cast_floats


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda: no CUDA device available; use --device cpu or auto")
    if device not in ("cpu", "cuda"):
        raise BadInput(f"--device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


def cast_model(model: nn.Module, run: RunDtype | None, device: torch.device) -> nn.Module:
    """Floating parameters and buffers to the run's compute dtype (integer ones stay as they are)."""
    model = model.to(device)
    if run is not None:
        model = model.to(run.torch_compute)
    return model.eval()


def cast_batch(kwargs: dict[str, Any], run: RunDtype | None, device: torch.device) -> dict[str, Any]:
    """Tensors to ``device``; floating ones to the run's compute dtype."""
    if run is None:
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return cast_floats(kwargs, run.torch_compute, device)


def run_context(run: RunDtype | None) -> contextlib.AbstractContextManager:
    """What a forward at ``run``'s precision runs inside: fp8 emulation for fp8 runs, else nothing."""
    if run is not None and run.fp8 is not None:
        from .fp8 import FP8Emulation

        return FP8Emulation(run.fp8)
    return contextlib.nullcontext()


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


@contextlib.contextmanager
def weights_as(model: nn.Module, state: dict[str, torch.Tensor] | None) -> Iterator[None]:
    """Parameters and buffers bound to ``state`` (by ``state_dict()`` name) for the duration, by
    rebinding their ``.data``: the user's tensors are never written, and the Parameter objects
    (with their hooks) stay the same. ``None``: the model as it is."""
    if not state:
        yield
        return
    swapped: list[tuple[torch.Tensor, torch.Tensor]] = []
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    try:
        for name, t in named:
            saved = state.get(name)
            # same tensor type too: a sharded DTensor copy never goes into FSDP2's gathered plain parameter
            if t is not None and saved is not None and saved.shape == t.shape and saved.dtype == t.dtype \
                    and type(saved) is type(t.data):
                swapped.append((t, t.data))
                t.data = saved
        yield
    finally:
        for t, data in reversed(swapped):
            t.data = data


def weights_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the parameters and (persistent) buffers by ``state_dict()`` name."""
    with torch.no_grad():
        return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()
                if isinstance(v, torch.Tensor)}
