"""Mixed-precision policies: which modules compute in a higher dtype than the rest.

A policy (the YAML ``nanhunter bisect --policy-out`` writes)::

    nanhunter_policy: 1
    dtype: fp16            # everything else
    keep_dtype: fp32
    modules: {encoder.layer.2.intermediate.dense: fp32}

``apply_policy(model, policy)`` expects the model at full precision (as loaded): it casts every
module to ``dtype`` except the listed ones (and their children), which get their kept dtype,
so their weights are never rounded through the low dtype. Hooks cast a kept module's floating
inputs up to its dtype and its outputs back down — only where they fit the low dtype's range
(an output that would overflow stays high; torch's type promotion carries it onward).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from .dtypes import canonical, limits, torch_dtype
from .errors import BadInput


class PolicyHandle:
    def __init__(self, model: nn.Module, handles: list[Any], policy: dict):
        self.model = model
        self.handles = handles
        self.policy = policy

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def load_policy(policy: str | Path | dict) -> dict:
    if isinstance(policy, dict):
        data = policy
    else:
        import yaml

        p = Path(policy)
        if not p.is_file():
            raise BadInput(f"policy {p}: file not found")
        data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict) or not isinstance(data.get("modules", {}), dict):
        raise BadInput("policy: expected a mapping with 'dtype', 'keep_dtype' and 'modules: {name: dtype}'")
    return {"dtype": canonical(str(data.get("dtype", "fp16"))), "keep_dtype": canonical(str(data.get("keep_dtype", "fp32"))),
            "modules": {str(k): canonical(str(v)) for k, v in (data.get("modules") or {}).items()}}


def _cast_tree(obj: Any, dtype: torch.dtype) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype != dtype else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*[_cast_tree(v, dtype) for v in obj])
    if isinstance(obj, (list, tuple)):
        t = [_cast_tree(v, dtype) for v in obj]
        return type(obj)(t) if isinstance(obj, list) else tuple(t)
    if isinstance(obj, dict):
        out = obj.__class__() if not hasattr(obj, "__dataclass_fields__") else obj
        for k, v in obj.items():
            out[k] = _cast_tree(v, dtype)
        return out
    return obj


def _cast_down_if_fits(obj: Any, dtype: torch.dtype, maxval: float) -> Any:
    if isinstance(obj, torch.Tensor):
        if not obj.is_floating_point() or obj.dtype == dtype:
            return obj
        # one host read per kept-module output: policies keep few modules
        if obj.numel() and not bool(obj.detach().abs().amax() <= maxval):
            return obj
        return obj.to(dtype)
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        t = [_cast_down_if_fits(v, dtype, maxval) for v in obj]
        return type(obj)(t) if isinstance(obj, list) else tuple(t)
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            obj[k] = _cast_down_if_fits(v, dtype, maxval)
        return obj
    return obj


def set_precision(model: nn.Module, low: str, keep: dict[str, str],
                  master: dict[str, torch.Tensor] | None = None) -> None:
    """Cast parameters and buffers module by module: kept subtrees to their dtype, the rest to
    ``low``. With ``master`` (full-precision tensors by state-dict name) values come from it, so
    switching a module back and forth never loses precision."""
    low_dt = torch_dtype(low)
    if low.startswith("fp8"):
        low_dt = torch.bfloat16
    prefixes = sorted(keep, key=len, reverse=True)
    for mname, mod in model.named_modules():
        kept = next((p for p in prefixes if mname == p or mname.startswith(p + ".") or p == ""), None)
        dt = torch_dtype(keep[kept]) if kept is not None else low_dt
        for pname, p in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            if p is None or not p.is_floating_point():
                continue
            full = f"{mname}.{pname}" if mname else pname
            src = master[full] if master is not None and full in master else p.data
            if src.dtype != dt or src is not p.data:
                p.data = src.to(device=p.device, dtype=dt)


def install_hooks(model: nn.Module, low: str, keep: dict[str, str]) -> list[Any]:
    low_dt = torch.bfloat16 if low.startswith("fp8") else torch_dtype(low)
    maxval = limits("bf16" if low.startswith("fp8") else low).max
    handles = []
    for name, dt in keep.items():
        try:
            mod = model.get_submodule(name) if name else model
        except AttributeError:
            raise BadInput(f"policy: module {name!r} is not in this model") from None
        kdt = torch_dtype(dt)

        def pre(m, args, kwargs, kdt=kdt):
            return _cast_tree(args, kdt), _cast_tree(kwargs, kdt)

        def post(m, args, output, low_dt=low_dt):
            return _cast_down_if_fits(output, low_dt, maxval)

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post))
    return handles


def apply_policy(model: nn.Module, policy: str | Path | dict) -> PolicyHandle:
    """Make the modules a bisect policy lists compute in their kept dtype (see module docstring).
    Returns a handle; ``handle.remove()`` removes the casting hooks."""
    pol = load_policy(policy)
    set_precision(model, pol["dtype"], pol["modules"])
    return PolicyHandle(model, install_hooks(model, pol["dtype"], pol["modules"]), pol)


def write_policy(path: str, dtype: str, keep_dtype: str, modules: list[str]) -> None:
    import yaml

    data = {"nanhunter_policy": 1, "dtype": dtype, "keep_dtype": keep_dtype,
            "modules": {m: keep_dtype for m in modules}}
    try:
        Path(path).write_text("# written by nanhunter bisect; apply with nan_hunter.apply_policy(model, path)\n"
                              + yaml.safe_dump(data, sort_keys=False))
    except OSError as e:
        raise BadInput(f"--policy-out {path}: cannot write ({e.strerror})") from None
