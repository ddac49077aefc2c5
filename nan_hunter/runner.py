"""Running a model: casting to the run dtype, forwards under capture, and targeted re-runs that
clone one module call's inputs so its ops can be replayed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .capture import Watch
from .dtypes import canonical, is_fp8, torch_dtype
from .errors import BadInput


class Captured(Exception):
    """Raised by a targeted re-run's hook once it has what it came for."""


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda: no CUDA device available; use --device cpu or auto")
    if device not in ("cpu", "cuda"):
        raise BadInput(f"--device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


def compute_dtype(dtype: str) -> torch.dtype:
    """Torch dtype the run computes in (fp8 modes compute in bf16 around emulated fp8 operands)."""
    d = canonical(dtype)
    return torch.bfloat16 if is_fp8(d) else torch_dtype(d)


def cast_model(model: nn.Module, dtype: str | None, device: torch.device) -> nn.Module:
    """Floating parameters and buffers to the run dtype (nn.Module.to leaves integer ones alone)."""
    model = model.to(device)
    if dtype is not None:
        model = model.to(compute_dtype(dtype))
    return model.eval()


def cast_batch(kwargs: dict[str, Any], dtype: str | None, device: torch.device) -> dict[str, Any]:
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            v = v.to(device)
            if dtype is not None and v.is_floating_point():
                v = v.to(compute_dtype(dtype))
        out[k] = v
    return out


def run_context(dtype: str | None, fp8_options: dict | None = None):
    """fp8 modes emulate quantised matmul operands; other dtypes need nothing around forward."""
    if dtype is not None and is_fp8(dtype):
        from .fp8 import FP8Emulation

        return FP8Emulation(canonical(dtype), **(fp8_options or {}))
    return contextlib.nullcontext()


def forward(model: nn.Module, kwargs: dict[str, Any], dtype: str | None = None,
            fp8_options: dict | None = None) -> Any:
    try:
        with torch.no_grad(), run_context(dtype, fp8_options):
            return model(**kwargs)
    except (BadInput, Captured):
        raise
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        raise BadInput(f"{type(model).__name__}.forward() raised {type(e).__name__}: {msg}; "
                       "check that the inputs match what the model expects") from None


def capture_run(model: nn.Module, batches: list[dict[str, Any]], level: str = "modules",
                dtype: str | None = None, fp8_options: dict | None = None) -> Watch:
    w = Watch(model, level=level, dtype=dtype, retain=len(batches))
    with w:
        for kw in batches:
            forward(model, kw, dtype, fp8_options)
    return w


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)):
        t = [_clone(v) for v in obj]
        return type(obj)(t) if isinstance(obj, list) else tuple(t)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def call_inputs(model: nn.Module, run: Callable[[], Any], module_name: str, call_index: int) -> tuple[tuple, dict]:
    """Call ``run()`` (a forward of ``model``) and clone the inputs of ``module_name``'s
    ``call_index``-th call, then stop the forward early: nothing after that call is computed."""
    target = model.get_submodule(module_name) if module_name else model
    seen = {"n": 0}
    box: dict[str, Any] = {}

    def pre(mod: nn.Module, args: tuple, kw: dict) -> None:
        if seen["n"] == call_index:
            box["args"], box["kwargs"] = _clone(args), _clone(kw)
            raise Captured
        seen["n"] += 1

    h = target.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        run()
    except Captured:
        pass
    finally:
        h.remove()
    if "args" not in box:
        raise RuntimeError(f"module {module_name!r} call {call_index} did not happen on re-run")
    return box["args"], box["kwargs"]


def locate_op(model: nn.Module, run: Callable[[], Any], finding: Any, dtype: str | None = None,
              fp8_options: dict | None = None) -> tuple[Any, nn.Module, tuple, dict]:
    """The op-level step of location: re-run (``run``) to clone the finding's module inputs, then
    replay that module under ``FirstBadOp``. Returns (op event or None, module, args, kwargs);
    data that was bad on arrival (role "input") has no producing op and is not re-run."""
    from .ops import first_bad_op

    c = finding.call
    target = model.get_submodule(c.module) if c.module else model
    if finding.role == "input":
        return None, target, (), {}
    args, kwargs = call_inputs(model, run, c.module, c.call_index)
    with run_context(dtype, fp8_options):
        ev, _ = first_bad_op(target, args, kwargs)
    return ev, target, args, kwargs


def refine(model: nn.Module, args: tuple, kwargs: dict, input_index: int = 0, dtype: str | None = None):
    """Module- then op-level location for one forward (used after a block-level capture)."""
    from .locate import WatchReport, call_table, failed_inputs, first_finding, mask_notes, to_first_nonfinite

    def run() -> Any:
        with torch.no_grad():
            return model(*args, **kwargs)

    w = Watch(model, level="modules", dtype=dtype, retain=1)
    w._forward = input_index - 1
    with w:
        run()
    f = first_finding(w)
    if f is None:
        return None
    ev, _, _, _ = locate_op(model, run, f)
    return WatchReport(to_first_nonfinite(f, ev), call_table(w), failed_inputs(w), mask_notes(w), ev)
