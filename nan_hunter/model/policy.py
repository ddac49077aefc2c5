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

from ..dtypes import RunDtype, canonical, torch_dtype
from ..errors import BadInput
from ..outputs import write_text
from ..tree import cast_floats, map_tensors


class PolicyHandle:
    def __init__(self, model: nn.Module, handles: list[Any], policy: dict):
        self.model = model
        self.handles = handles
        self.policy = policy

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


#: the keys of a policy (``policy_yaml``)
POLICY_KEYS = ("nanhunter_policy", "dtype", "keep_dtype", "modules")


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
    unknown = sorted(str(k) for k in data if k not in POLICY_KEYS)
    if unknown:  # a misspelt 'modules' would keep nothing and cast the whole model down
        raise BadInput(f"policy: unknown key {unknown[0]!r} (a policy has {', '.join(POLICY_KEYS)})")
    return {
        "dtype": canonical(str(data.get("dtype", "fp16"))),
        "keep_dtype": canonical(str(data.get("keep_dtype", "fp32"))),
        "modules": {str(k): canonical(str(v)) for k, v in (data.get("modules") or {}).items()},
    }


def _cast_down_if_fits(obj: Any, dtype: torch.dtype, maxval: float) -> Any:
    """Floating tensors cast to ``dtype`` where every value fits its range; the others stay high
    (torch's type promotion carries them onward rather than turning them into inf)."""

    def down(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or t.dtype == dtype:
            return t
        # one host read per kept-module output: policies keep few modules
        if t.numel() and not bool(t.detach().abs().amax() <= maxval):
            return t
        return t.to(dtype)

    return map_tensors(obj, down)


def _low(low: str | RunDtype) -> RunDtype:
    """The policy's low dtype by the one dtype rule (an fp8 policy stores and computes in bf16)."""
    return low if isinstance(low, RunDtype) else RunDtype.of(low)


def set_precision(
    model: nn.Module, low: str | RunDtype, keep: dict[str, str], master: dict[str, torch.Tensor] | None = None
) -> None:
    """Cast parameters and buffers module by module: kept subtrees to their dtype, the rest to
    ``low``. With ``master`` (full-precision tensors by state-dict name) values come from it, so
    switching a module back and forth never loses precision."""
    low_dt = _low(low).torch_compute
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


def install_hooks(model: nn.Module, low: str | RunDtype, keep: dict[str, str]) -> list[Any]:
    """Per kept module: inputs cast up to its dtype, outputs cast back to the dtype around it —
    the nearest kept ancestor's, else the low dtype — where they fit that dtype's range."""
    low_run = _low(low)
    handles = []
    for name, dt in keep.items():
        try:
            mod = model.get_submodule(name) if name else model
        except AttributeError:
            raise BadInput(f"policy: module {name!r} is not in this model") from None
        kdt = torch_dtype(dt)
        outer = max(
            (k for k in keep if k != name and (k == "" or name.startswith(k + "."))), key=len, default=None
        )
        out_run = low_run if outer is None else RunDtype.of(keep[outer])
        out_dt, maxval = out_run.torch_compute, out_run.range.max

        def pre(m, args, kwargs, kdt=kdt):
            return cast_floats(args, kdt), cast_floats(kwargs, kdt)

        def post(m, args, output, out_dt=out_dt, maxval=maxval):
            return _cast_down_if_fits(output, out_dt, maxval)

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post))
    return handles


def apply_policy(model: nn.Module, policy: str | Path | dict) -> PolicyHandle:
    """Make the modules a bisect policy lists compute in their kept dtype (see module docstring).
    Returns a handle; ``handle.remove()`` removes the casting hooks."""
    pol = load_policy(policy)
    set_precision(model, pol["dtype"], pol["modules"])
    return PolicyHandle(model, install_hooks(model, pol["dtype"], pol["modules"]), pol)


def policy_yaml(dtype: str, keep_dtype: str, modules: list[str]) -> str:
    """The policy file ``apply_policy`` reads back."""
    import yaml

    data = {
        "nanhunter_policy": 1,
        "dtype": dtype,
        "keep_dtype": keep_dtype,
        "modules": {m: keep_dtype for m in modules},
    }
    return (
        "# written by nanhunter bisect; apply with nan_hunter.apply_policy(model, path)\n"
        + yaml.safe_dump(data, sort_keys=False)
    )


def write_policy(path: str, dtype: str, keep_dtype: str, modules: list[str]) -> None:
    """``--policy-out PATH`` (``-``: stdout), written atomically by ``nan_hunter.outputs``."""

    write_text("--policy-out", path, policy_yaml(dtype, keep_dtype, modules))
