"""The fix oracle: a report's fix applied as printed, with plain torch/transformers code (no
nanhunter), to a fresh copy of the whole model, and the model's outputs judged against fp32.

``apply_and_run(model_dir, batch, applied_as)`` loads the checkpoint directory with transformers at
full precision and applies ``diagnosis.fix_verified.applied_as``:

- ``policy`` ``{module: "fp32"}`` with ``dtype`` the rest's: every other module's weights cast to
  ``dtype``; each kept module's floating inputs cast to fp32 before it runs and its floating
  outputs cast back to ``dtype`` only where every value fits ``dtype``'s range (what the printed
  fix says its hooks do); an output that does not fit stays fp32;
- ``dtype``: the whole model in that dtype;
- ``option`` ``attn_implementation="sdpa"``: loaded with SDPA attention, in the run's dtype.

``judge(outs, ref, rtol)``: finite, and max |a − b| / max |b| over all outputs within ``rtol``.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def load(model_dir: str, dtype: torch.dtype = torch.float32, attn: str = "eager") -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    cfg = AutoConfig.from_pretrained(model_dir)
    cls = AutoModelForSeq2SeqLM if getattr(cfg, "is_encoder_decoder", False) else AutoModelForCausalLM
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"  # the keyword's name before 4.56
    return cls.from_pretrained(model_dir, attn_implementation=attn, **{key: dtype}).eval()


def _floats(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.is_floating_point() else []
    if isinstance(obj, dict) or hasattr(obj, "keys"):
        return [t for k in obj.keys() for t in _floats(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _floats(x)]
    return []


def _logits(out: Any) -> list[torch.Tensor]:
    return [out.logits.detach()] if hasattr(out, "logits") else [t.detach() for t in _floats(out)]


def _cast(obj: Any, dt: torch.dtype, only_if_fits: bool = False) -> Any:
    if isinstance(obj, torch.Tensor):
        if not obj.is_floating_point() or obj.dtype == dt:
            return obj
        if only_if_fits and obj.numel() and float(obj.detach().abs().max()) > torch.finfo(dt).max:
            return obj
        return obj.to(dt)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_cast(x, dt, only_if_fits) for x in obj)
    if isinstance(obj, list):
        return [_cast(x, dt, only_if_fits) for x in obj]
    if isinstance(obj, dict):
        return {k: _cast(v, dt, only_if_fits) for k, v in obj.items()}
    return obj


def with_policy(model: torch.nn.Module, low: torch.dtype, keep: dict[str, str]) -> torch.nn.Module:
    m = copy.deepcopy(model)
    kept = {name: DTYPES[d] for name, d in keep.items()}
    m.to(low)
    for name, dt in kept.items():
        sub = m.get_submodule(name)
        sub.to(dt)
        sub.load_state_dict({k: v.to(dt) for k, v in model.get_submodule(name).state_dict().items()})

        def pre(mod, args, kwargs, dt=dt):
            return _cast(args, dt), _cast(kwargs, dt)

        def post(mod, args, out):
            return _cast(out, low, only_if_fits=True)

        sub.register_forward_pre_hook(pre, with_kwargs=True)
        sub.register_forward_hook(post)
    return m


def apply_and_run(
    model_dir: str, batch: dict[str, torch.Tensor], applied_as: dict[str, Any]
) -> list[torch.Tensor]:
    """The model's outputs with the fix applied as printed (see the module docstring)."""
    kind = applied_as["kind"]
    if kind == "policy":
        low = DTYPES[applied_as["dtype"]]
        m = with_policy(load(model_dir), low, applied_as["policy"])
    elif kind == "dtype":
        m = load(model_dir, DTYPES[applied_as["dtype"]])
    elif kind == "option" and applied_as["option"] == 'attn_implementation="sdpa"':
        m = load(model_dir, DTYPES[applied_as.get("run_dtype") or "fp16"], attn="sdpa")
    else:
        raise NotImplementedError(f"the fix oracle cannot apply {applied_as}")
    with torch.no_grad():
        return _logits(m(**batch))


def reference(model_dir: str, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return _logits(load(model_dir)(**batch))


def judge(outs: list[torch.Tensor], ref: list[torch.Tensor], rtol: float) -> tuple[bool, float]:
    """(finite and within ``rtol`` of ``ref``, the relative error)."""
    if not all(bool(torch.isfinite(o).all()) for o in outs):
        return False, math.inf
    num = max(float((o.double() - r.double()).abs().max()) for o, r in zip(outs, ref))
    den = max(float(r.double().abs().max()) for r in ref) or 1.0
    err = num / den
    return err <= rtol, err
