"""Replay: re-run the failing region from its captured inputs in every dtype, against float64.

The region is the producer module (optionally with its parent, when the NaN only shows one
module later). A deep copy of the module is cast to each dtype with its inputs; fp8 modes run
in their compute dtype under ``FP8Emulation``. Relative error = max |y - ref| / max |ref| over
the finite float outputs, against the same region run in float64.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from .dtypes import REPLAY_DTYPES, is_fp8
from .runner import compute_dtype
from .sink import flatten


def _cast(obj: Any, dtype: torch.dtype) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        t = [_cast(v, dtype) for v in obj]
        return type(obj)(t) if isinstance(obj, list) else tuple(t)
    if isinstance(obj, dict):
        return {k: _cast(v, dtype) for k, v in obj.items()}
    return obj


def _outputs(out: Any) -> list[torch.Tensor]:
    return [t for _, t in flatten(out)]


def run_region(module: nn.Module, args: tuple, kwargs: dict, dtype: str | torch.dtype,
               fp8_options: dict | None = None) -> list[torch.Tensor]:
    from .fp8 import FP8Emulation

    m = copy.deepcopy(module)
    if isinstance(dtype, str):
        tdt = compute_dtype(dtype)
        if is_fp8(dtype) and (fp8_options or {}).get("compute") == "fp32":
            tdt = torch.float32
    else:
        tdt = dtype
    m = m.to(tdt).eval()
    a, kw = _cast(args, tdt), _cast(kwargs, tdt)
    with torch.no_grad():
        if isinstance(dtype, str) and is_fp8(dtype):
            with FP8Emulation(dtype, **(fp8_options or {})):
                out = m(*a, **kw)
        else:
            out = m(*a, **kw)
    return _outputs(out)


def summarize(outs: list[torch.Tensor], ref: list[torch.Tensor] | None) -> dict[str, Any]:
    nan = pos = neg = 0
    absmax = None
    err_num = err_den = 0.0
    comparable = ref is not None and len(ref) == len(outs)
    for i, t in enumerate(outs):
        f = t.detach().double()
        isn, isi = torch.isnan(f), torch.isinf(f)
        nan += int(isn.sum())
        pos += int((isi & (f > 0)).sum())
        neg += int((isi & (f < 0)).sum())
        fin = f[~(isn | isi)]
        if fin.numel():
            a = float(fin.abs().max())
            absmax = a if absmax is None else max(absmax, a)
        if comparable:
            r = ref[i].detach().double()
            if r.shape == f.shape and torch.isfinite(r).all():
                err_num = max(err_num, float((f - r).abs().max()) if f.numel() else 0.0)
                err_den = max(err_den, float(r.abs().max()) if r.numel() else 0.0)
    finite = not (nan or pos or neg)
    rel = None
    if finite and comparable:
        rel = err_num / err_den if err_den > 0 else (0.0 if err_num == 0 else math.inf)
    return {"finite": finite, "nan": nan, "posinf": pos, "neginf": neg, "absmax": absmax, "rel_err": rel}


def replay(module: nn.Module, args: tuple, kwargs: dict, fp8_options: dict | None = None) -> dict[str, dict]:
    """The replay matrix: each of fp32, bf16, fp16, fp8-e4m3, fp8-e5m2 (and fp64 as reference)."""
    try:
        ref = run_region(module, args, kwargs, torch.float64)
    except Exception:  # some ops have no float64 kernel on this device
        ref = None
    matrix: dict[str, dict] = {}
    for d in REPLAY_DTYPES:
        try:
            outs = run_region(module, args, kwargs, d, fp8_options)
            matrix[d] = summarize(outs, ref)
        except Exception as e:
            matrix[d] = {"finite": False, "nan": 0, "posinf": 0, "neginf": 0, "absmax": None, "rel_err": None,
                         "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    if ref is not None:
        matrix["fp64"] = summarize(ref, ref)
    return matrix
