"""Replay: re-run the failing region from its captured inputs in every dtype, against float64.

The region is the producer module (optionally with its parent, when the NaN only shows one
module later). A deep copy of the module is cast to each dtype's compute dtype with its inputs
(the one dtype rule: ``RunDtype``); fp8 modes run under fp8 emulation with the run's recipe.
Relative error = max |y - ref| / max |ref| over
the finite float outputs, against the same region run in float64.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from .dtypes import REPLAY_DTYPES, RunDtype
from .execute import run_context
from .tree import cast_floats, detached_copy, float_tensors


def float_outputs(out: Any) -> list[torch.Tensor]:
    """The floating tensors of a module's output, detached, in a fixed order."""
    return [t.detach() for _, t in float_tensors(out)]


def rel_err(outs: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """max |a - b| / max |b| over all float outputs (inf when non-finite or mismatched)."""
    num = den = 0.0
    if len(outs) != len(ref):
        return math.inf
    for a, b in zip(outs, ref):
        a64, b64 = a.double(), b.double()
        if a64.shape != b64.shape or not bool(torch.isfinite(a64).all()):
            return math.inf
        if a64.numel():
            num = max(num, float((a64 - b64).abs().max()))
            den = max(den, float(b64.abs().max()))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def run_region(module: nn.Module, args: tuple, kwargs: dict, run: RunDtype | torch.dtype) -> list[torch.Tensor]:
    """A deep copy of ``module`` run on ``args``/``kwargs`` at ``run``'s precision (or a plain torch
    dtype such as float64 for the reference); the module and inputs given are not changed."""
    tdt = run.torch_compute if isinstance(run, RunDtype) else run
    m = copy.deepcopy(module).to(tdt).eval()
    a, kw = cast_floats(detached_copy((args, kwargs)), tdt)  # in-place ops and caches change inputs
    with torch.no_grad(), run_context(run if isinstance(run, RunDtype) else None):
        out = m(*a, **kw)
    return float_outputs(out)


def summarize(outs: list[torch.Tensor], ref: list[torch.Tensor] | None) -> dict[str, Any]:
    nan = pos = neg = 0
    absmax = None
    comparable = ref is not None and len(ref) == len(outs)
    for t in outs:
        f = t.detach().double()
        isn, isi = torch.isnan(f), torch.isinf(f)
        nan += int(isn.sum())
        pos += int((isi & (f > 0)).sum())
        neg += int((isi & (f < 0)).sum())
        fin = f[~(isn | isi)]
        if fin.numel():
            a = float(fin.abs().max())
            absmax = a if absmax is None else max(absmax, a)
    finite = not (nan or pos or neg)
    rel = None
    if finite and comparable and all(bool(torch.isfinite(r).all()) for r in ref):
        rel = rel_err(outs, ref)
    return {"finite": finite, "nan": nan, "posinf": pos, "neginf": neg, "absmax": absmax, "rel_err": rel}


def replay(module: nn.Module, args: tuple, kwargs: dict, run: RunDtype | None = None) -> dict[str, dict]:
    """The replay matrix: each of fp32, bf16, fp16, fp8-e4m3, fp8-e5m2 (and fp64 as reference),
    fp8 columns with ``run``'s fp8 recipe."""
    run = run or RunDtype.of("fp32")
    try:
        ref = run_region(module, args, kwargs, torch.float64)
    except Exception:  # some ops have no float64 kernel on this device
        ref = None
    matrix: dict[str, dict] = {}
    for d in REPLAY_DTYPES:
        try:
            outs = run_region(module, args, kwargs, run.with_name(d))
            matrix[d] = summarize(outs, ref)
        except Exception as e:
            matrix[d] = {"finite": False, "nan": 0, "posinf": 0, "neginf": 0, "absmax": None, "rel_err": None,
                         "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    if ref is not None:
        matrix["fp64"] = summarize(ref, ref)
    return matrix
