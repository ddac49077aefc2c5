"""A model at a run's precision: the device, casting by the one dtype rule (``dtypes.RunDtype``),
the context a run executes in, and the weights swapped in and out (running one under capture:
``capture.run``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ..dtypes import RunDtype
from ..tree import cast_floats
from .device import check_device
from .fp8 import FP8Emulation


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    return torch.device(device)


def cast_model(model: nn.Module, run: RunDtype | None, device: torch.device) -> nn.Module:
    """Floating parameters and buffers to the run's compute dtype (integer ones stay as they are). A
    model transformers loaded quantized (bitsandbytes, GPTQ, AWQ, ...) runs in its own form: its packed
    weights cannot be cast (``quantized_form``)."""
    if quantized_form(model) is not None:
        if next(model.parameters(), torch.empty(0)).device != device:
            model = model.to(device)
        return model.eval()
    model = model.to(device)
    if run is not None:
        model = model.to(run.torch_compute)
    return model.eval()


def quantized_form(model: nn.Module) -> str | None:
    """The quantization method a transformers model was loaded with (``"bitsandbytes"``, ``"gptq"``,
    ...), None for a plain model."""
    if not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None:
        return None
    qc = getattr(getattr(model, "config", None), "quantization_config", None)
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return str(getattr(method, "value", method) or "quantized")


def own_compute_dtype(model: nn.Module) -> str:
    """The dtype name (``fp32``/``fp16``/``bf16``) a quantized model's unquantized parts run in."""
    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    return names.get(getattr(model, "dtype", torch.float32), "fp32")


def cast_batch(kwargs: dict[str, Any], run: RunDtype | None, device: torch.device) -> dict[str, Any]:
    """Tensors to ``device``; floating ones to the run's compute dtype."""
    if run is None:
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return cast_floats(kwargs, run.torch_compute, device)


def run_context(run: RunDtype | None) -> contextlib.AbstractContextManager:
    """What a forward at ``run``'s precision runs inside: fp8 emulation for fp8 runs, else nothing."""
    if run is not None and run.fp8 is not None:
        return FP8Emulation(run.fp8)
    return contextlib.nullcontext()


@contextlib.contextmanager
def weights_as(model: nn.Module, state: dict[str, torch.Tensor] | None) -> Iterator[None]:
    """Parameters and buffers bound to ``state`` (by ``state_dict()`` name) for the duration, by
    rebinding their ``.data``: the user's tensors are never written, and the Parameter objects
    (with their hooks) stay the same. ``None``: the model as it is."""
    if not state:
        yield
        return
    swapped: list[tuple[torch.Tensor, torch.Tensor]] = []
    named = list(model.named_parameters(remove_duplicate=False)) + list(
        model.named_buffers(remove_duplicate=False)
    )
    try:
        for name, t in named:
            saved = state.get(name)
            # same tensor type too: a sharded DTensor copy never goes into FSDP2's gathered plain parameter
            if (
                t is not None
                and saved is not None
                and saved.shape == t.shape
                and saved.dtype == t.dtype
                and type(saved) is type(t.data)
            ):
                swapped.append((t, t.data))
                t.data = saved
        yield
    finally:
        for t, data in reversed(swapped):
            t.data = data


def weights_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the parameters and (persistent) buffers by ``state_dict()`` name."""
    with torch.no_grad():
        return {
            k: v.detach().clone()
            for k, v in model.state_dict(keep_vars=True).items()
            if isinstance(v, torch.Tensor)
        }
