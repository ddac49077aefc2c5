"""Replay: re-run the failing region from its captured inputs in every dtype, against float64.

The region is the producer module (optionally with its parent, when the NaN only shows one
module later). A deep copy of the module is cast to each dtype's compute dtype with its inputs
(the one dtype rule: ``RunDtype``); fp8 modes run under fp8 emulation with the run's recipe.
Relative error = max |y - ref| / max |ref| over
the finite float outputs, against the same region run in float64.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..dtypes import REPLAY_DTYPES, RunDtype
from ..kernels.compare import compare, flat
from ..locate.training_phases import fresh_optimizer
from ..model.copy_run import copy_at, precision, run_copy, torch_dtype_of
from ..report import ReplayRow
from ..tree import float_tensors, map_tensors


def float_outputs(out: Any) -> list[torch.Tensor]:
    """The floating tensors of a module's output, detached, in a fixed order."""
    return flat(out)


def run_region(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], run: RunDtype | torch.dtype
) -> list[torch.Tensor]:
    """A deep copy of ``module`` run on ``args``/``kwargs`` at ``run``'s precision (or a plain torch
    dtype such as float64 for the reference); the module and inputs given are not changed."""
    return float_outputs(run_copy(module, args, kwargs, run))


def summarize(outs: list[torch.Tensor], ref: list[torch.Tensor] | None) -> ReplayRow:
    nan = pos = neg = 0
    absmax = None
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
    rel = compare(outs, ref).finite_rel_err if ref is not None else None
    return ReplayRow(finite, nan, pos, neg, absmax, rel)


def replay(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], run: RunDtype | None = None
) -> dict[str, ReplayRow]:
    """The replay matrix: each of fp32, bf16, fp16, fp8-e4m3, fp8-e5m2 (and fp64 as reference),
    fp8 columns with ``run``'s fp8 recipe."""
    run = run or RunDtype.of("fp32")
    try:
        ref = run_region(module, args, kwargs, torch.float64)
    except Exception:  # some ops have no float64 kernel on this device
        ref = None
    matrix: dict[str, ReplayRow] = {}
    for d in REPLAY_DTYPES:
        try:
            outs = run_region(module, args, kwargs, run.with_name(d))
            matrix[d] = summarize(outs, ref)
        except Exception as e:
            matrix[d] = failed_row(e)
    if ref is not None:
        matrix["fp64"] = summarize(ref, ref)
    return matrix


# --- training faults: the failing module's backward, one parameter's optimizer step --------------


def _leaf_inputs(obj: Any) -> tuple[Any, list[torch.Tensor]]:
    """Floating tensors of ``obj`` as fresh leaves that require grad (the region's inputs)."""

    leaves: list[torch.Tensor] = []

    def mark(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            t = t.detach().requires_grad_(True)
            leaves.append(t)
        return t

    return map_tensors(obj, mark), leaves


def run_backward_region(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    grads: list[Any],
    run: RunDtype | torch.dtype,
) -> list[torch.Tensor]:
    """A deep copy of ``module`` at ``run``'s precision: forward from copies of ``args``/``kwargs``,
    backward from ``grads`` (cast to it); the gradients it produces w.r.t. its floating inputs and
    its parameters, in a fixed order."""
    tdt = torch_dtype_of(run)
    m, a, kw = copy_at(module, args, kwargs, run, training=None)
    (a, kw), leaves = _leaf_inputs((a, kw))
    params = [p for p in m.parameters() if p.requires_grad]
    with torch.enable_grad(), precision(run):
        out = m(*a, **kw)
        outs = [t for _, t in float_tensors(out)]
        pairs = [(t, g.to(tdt)) for t, g in zip(outs, grads) if g is not None and t.requires_grad]
        wrt = leaves + params
        if not pairs or not wrt:
            return []
        res = torch.autograd.grad([t for t, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
    return [g.detach() for g in res if g is not None]


def backward_replay(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    grads: list[Any],
    run: RunDtype | None = None,
) -> dict[str, ReplayRow]:
    """The replay matrix of a backward fault: the failing module's forward and backward from its
    captured inputs and the gradient that reached its outputs, in each dtype; the entries measure
    the gradients it produces (w.r.t. its inputs and parameters) against float64."""
    run = run or RunDtype.of("fp32")
    try:
        ref = run_backward_region(module, args, kwargs, grads, torch.float64)
    except Exception:  # some ops have no float64 kernel on this device
        ref = None
    matrix: dict[str, ReplayRow] = {}
    for d in REPLAY_DTYPES:
        try:
            matrix[d] = summarize(run_backward_region(module, args, kwargs, grads, run.with_name(d)), ref)
        except Exception as e:
            matrix[d] = failed_row(e)
    if ref is not None:
        matrix["fp64"] = summarize(ref, ref)
    return matrix


def failed_row(e: Exception) -> ReplayRow:
    """The row of a dtype whose run raised: not finite, nothing measured, the error's first line."""
    return ReplayRow(False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def optimizer_replay(
    cls: type,
    hyper: dict[str, Any],
    weight: torch.Tensor,
    grad: torch.Tensor,
    state: dict[str, torch.Tensor],
    run: RunDtype | None = None,
) -> dict[str, ReplayRow]:
    """The replay matrix of an optimizer fault: one parameter's ``step()`` from its value, gradient
    and optimizer state before the step, with a fresh optimizer of the same class and
    hyperparameters, parameter, gradient and floating state cast to each dtype; the entries
    measure the parameter after the step against the same step in float64. fp8 columns store
    the parameter in fp8's compute dtype under fp8 emulation (optimizers run no matmul, so they
    match it)."""
    run = run or RunDtype.of("fp32")

    def one(r: RunDtype | torch.dtype) -> list[torch.Tensor]:
        o, p = fresh_optimizer(cls, hyper, weight, grad, state, torch_dtype_of(r))
        with precision(r):
            o.step()
        return [p.detach()]

    try:
        ref = one(torch.float64)
    except Exception:
        ref = None
    matrix: dict[str, ReplayRow] = {}
    for d in REPLAY_DTYPES:
        try:
            matrix[d] = summarize(one(run.with_name(d)), ref)
        except Exception as e:
            matrix[d] = failed_row(e)
    if ref is not None:
        matrix["fp64"] = summarize(ref, ref)
    return matrix
