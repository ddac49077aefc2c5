"""Verified fixes (contract v1.2): the fix a diagnosis proposes, applied to a copy and re-run.

``verify_fix(diagnosis, region, run, model=, batch=)`` picks the mechanical change for the
diagnosis' cause, applies it to a deep copy of the failing region (the module with the inputs
it was called with) — or, given the whole model and the failing input, to a copy of the model —
re-runs it, and returns a ``FixVerified``: whether the output is finite and how far it is from
the all-fp32 run. Neither the user's model nor the captured inputs are changed.

Mechanical changes, by cause:

- ``overflow``: keep the module in fp32 (``model.policy.apply_policy``); attention scores: SDPA
  instead of eager attention (a transformers model; the run's dtype kept), then run in bf16; the
  residual stream: run in bf16; an fp8 run: no mechanical fix.
- ``division_by_zero``: an eps the dtype can hold (the module's ``eps``-like attribute raised to
  the dtype's smallest normal), else keep the module in fp32.
- ``scale_underflow``: compute the scale in fp32 (keep the module in fp32), else a clamped scale
  (a divisor never smaller than 1 / the dtype's max).
- ``masked_softmax``: SDPA instead of eager attention (a transformers model), else a safe softmax
  (a fully masked row gives zeros, as SDPA's does).
- ``compile_divergence``: ``emulate_precision_casts``, re-run by ``modes/compiled.py`` and
  turned into a ``FixVerified`` by ``from_emulate_precision_casts``.

Every other cause has no mechanical fix (``no_mechanical_fix`` says why).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..dtypes import RunDtype as RD
from ..kernels.compare import compare
from ..locate.region import Region
from ..model.copy_run import copy_at, precision
from ..model.policy import apply_policy
from ..report import Diagnosis, FixVerified
from ..tree import float_tensors
from .fix_words import MECHANICAL, NO_FIX, UNVERIFIED, no_mechanical_fix

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from ..dtypes import RunDtype

__all__ = ["MECHANICAL", "NO_FIX", "UNVERIFIED", "FixVerified", "Region", "from_emulate_precision_casts",
           "no_mechanical_fix", "verify_fix", "with_verdict"]

#: attributes holding an epsilon, as torch and transformers name them
EPS_NAMES = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps", "norm_eps", "rms_norm_eps")
#: the largest model (parameter bytes) copied whole for a model-level check; bigger: the region only
MODEL_COPY_LIMIT = 2 << 30



@dataclass(frozen=True)
class Change:
    """One mechanical fix: what it says, and how it is applied to a copy (a context to run the
    copy in, given the copy and the run's precision)."""

    text: str
    apply: Callable[[nn.Module, str, RunDtype], contextlib.AbstractContextManager]
    whole_model: bool = True  # meaningful on a copy of the whole model (else: the region only)


# --- the changes ---------------------------------------------------------------------------------


def _keep(dtype: str) -> Callable[[nn.Module, str, RunDtype], contextlib.AbstractContextManager]:
    @contextlib.contextmanager
    def apply(model: nn.Module, name: str, run: RunDtype) -> Iterator[None]:

        handle = apply_policy(model, {"dtype": run.name, "keep_dtype": dtype, "modules": {name: dtype}})
        try:
            yield
        finally:
            handle.remove()
    return apply


def _run_in(dtype: str) -> Callable[[nn.Module, str, RunDtype], contextlib.AbstractContextManager]:
    @contextlib.contextmanager
    def apply(model: nn.Module, name: str, run: RunDtype) -> Iterator[None]:
        yield  # the copy and its inputs are cast to ``dtype`` by the caller (``Plan.dtype``)
    apply.run_dtype = dtype  # type: ignore[attr-defined]
    return apply


@contextlib.contextmanager
def _eps_it_holds(model: nn.Module, name: str, run: RunDtype) -> Iterator[None]:
    """Every eps-like attribute of the module (and its children) that rounds to zero or to a
    subnormal in the run's dtype raised to the dtype's smallest normal."""
    target = model.get_submodule(name) if name else model
    floor = run.range.smallest_normal
    changed = 0
    for m in target.modules():
        for attr in EPS_NAMES:
            v = getattr(m, attr, None)
            if isinstance(v, float) and 0 < v < floor:
                setattr(m, attr, floor)
                changed += 1
    if not changed:
        raise _NotApplicable("no eps attribute below the dtype's smallest normal")
    yield


@contextlib.contextmanager
def _safe_softmax(model: nn.Module, name: str, run: RunDtype) -> Iterator[None]:
    """softmax/log_softmax of a fully masked row (all −inf) gives zeros instead of NaN."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    ops = {torch.ops.aten._softmax.default, torch.ops.aten._log_softmax.default,
           torch.ops.aten._safe_softmax.default}

    class SafeSoftmax(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in ops:
                x, dim = args[0], args[1]
                masked = torch.isneginf(x).all(dim=dim, keepdim=True)
                out = out.masked_fill(masked, 0.0)
            return out

    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # nn.MultiheadAttention: the slow path, whose softmax this is
    try:
        with SafeSoftmax():
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(prev)


@contextlib.contextmanager
def _clamped_scale(model: nn.Module, name: str, run: RunDtype) -> Iterator[None]:
    """A divisor (reciprocal, div) never smaller in magnitude than 1 / the dtype's max, so the
    inverted scale cannot overflow; zeros are left alone (that is a division by zero)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    lim = 1.0 / run.range.max

    def clamp(d: torch.Tensor) -> torch.Tensor:
        if not d.is_floating_point():
            return d
        floor = torch.tensor(lim, dtype=torch.float32).to(d.dtype).item()
        floor = floor if floor >= lim else floor * (1 + 2 * run.range.eps)
        small = (d != 0) & (d.abs() < floor)
        return torch.where(small, torch.sign(d) * floor, d)

    class ClampedScale(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.reciprocal.default:
                args = (clamp(args[0]),)
            elif func is torch.ops.aten.div.Tensor and isinstance(args[1], torch.Tensor):
                args = (args[0], clamp(args[1]))
            return func(*args, **(kwargs or {}))

    with ClampedScale():
        yield


def _eager_configs(target: nn.Module) -> list[Any]:
    """The transformers configs held by ``target`` and its submodules whose attention
    implementation is "eager" (each once: the layers of a model share theirs)."""
    found: dict[int, Any] = {}
    for m in target.modules():
        cfg = getattr(m, "config", None)
        if getattr(cfg, "_attn_implementation", None) == "eager":
            found[id(cfg)] = cfg
    return list(found.values())


@contextlib.contextmanager
def _sdpa(model: nn.Module, name: str, run: RunDtype) -> Iterator[None]:
    """transformers' attention switched from "eager" to "sdpa" on the copy: the whole model by
    ``set_attn_implementation`` (it checks the class supports SDPA and rebuilds its masks at the
    next forward), a module of it (the region) by its config, which its attention modules read at
    call time. Applies only where the copy's attention is eager, and holds only where SDPA then
    really ran (a model whose attention classes do not dispatch on the config is not changed)."""
    import torch
    from torch.overrides import TorchFunctionMode

    configs = _eager_configs(model)
    if not configs:
        raise _NotApplicable("no transformers attention set to eager")
    tf = sys.modules.get("transformers")  # a PreTrainedModel means transformers is imported already
    if tf is not None and isinstance(model, tf.PreTrainedModel) and hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("sdpa")
        except Exception as e:  # noqa: BLE001 - the class does not support SDPA
            raise _NotApplicable(f"{type(model).__name__} cannot use sdpa: {e}") from None
    else:
        for cfg in configs:
            cfg._attn_implementation = "sdpa"
    if _eager_configs(model):
        raise _NotApplicable("the attention implementation stayed eager")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = 0

    class SeeSDPA(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            nonlocal calls
            if func is sdpa:
                calls += 1
            return func(*args, **(kwargs or {}))

    with SeeSDPA():
        yield
    if not calls:
        raise _NotApplicable("scaled_dot_product_attention never ran: the attention does not dispatch on the config")


class _NotApplicable(Exception):
    """The change does not apply to this module (e.g. it has no eps attribute)."""


def _changes(d: Diagnosis, run: RunDtype, module_type: str | None) -> list[Change]:
    name = d.module or "the root module"
    keep32 = Change(f"keep {name} in fp32 (apply_policy)", _keep("fp32"))
    # a transformers model in eager attention (else not applicable): the smallest change a user can make,
    # the run's dtype kept, so tried first where SDPA is the fix
    sdpa = Change('attn_implementation="sdpa" instead of "eager"', _sdpa)
    if d.cause == "overflow":
        if run.is_fp8:  # fp8 emulation covers every matmul of the run: keeping one module higher is not mechanical
            return []
        summary = d.summary.lower()
        bf16 = Change("run in bf16", _run_in("bf16"))
        if "attention scores" in summary:
            changes = [sdpa, bf16, keep32] if run.compute != "bf16" else [sdpa, keep32, bf16]
        elif "residual stream" in summary and run.compute != "bf16":
            changes = [bf16, keep32]
        else:
            changes = [keep32, bf16] if run.compute != "fp32" else []
        # never the dtype the run already computed in: no change at all
        return [c for c in changes if not (c is keep32 and run.compute == "fp32" or c is bf16 and run.compute == "bf16")]
    if d.cause == "division_by_zero":
        return [Change(f"an eps {run.compute} can hold (≥ {run.range.smallest_normal:.2g}) in {name}", _eps_it_holds),
                keep32]
    if d.cause == "scale_underflow":
        return [Change(f"compute the scale in fp32 (keep {name} in fp32, apply_policy)", _keep("fp32")),
                Change(f"a clamped scale in {name} (|divisor| ≥ 1/{run.range.name} max)", _clamped_scale,
                       whole_model=False)]
    if d.cause == "masked_softmax":
        return [sdpa, Change(f"a safe softmax in {name} (a fully masked row gives zeros, as SDPA's)", _safe_softmax,
                             whole_model=False)]
    return []




# --- running a copy ------------------------------------------------------------------------------


def _outputs(fn: Callable[[], Any]) -> dict[str, Any]:
    """The floating tensors of ``fn()``'s output by where they sit in it ("[0]", "logits"...)."""
    import torch


    with torch.no_grad():
        return {k: t.detach() for k, t in float_tensors(fn())}


def _finite(tensors: Iterable[Any]) -> bool:
    import torch

    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _rel(outs: dict[str, Any], ref: dict[str, Any] | None) -> float | None:
    """Max rel err of ``outs`` against ``ref`` over the outputs both runs give: a change may drop an
    auxiliary one (SDPA never forms the attention probabilities eager attention returns)."""

    keys = [k for k in outs if ref is not None and k in ref]
    if ref is None or not keys:
        return None
    if not _finite(outs.values()):  # an output the comparison leaves out must be finite too
        return None
    return compare([outs[k] for k in keys], [ref[k] for k in keys]).finite_rel_err


@dataclass
class Outcome:
    """One run of a copy: its floating outputs, and whether the failing region's own outputs (every
    call of that module) stayed finite — where a verification is judged: a fault absorbed before
    the model's output (a later mask or softmax) leaves the outputs finite with or without a fix."""

    outputs: dict[str, Any]
    region_finite: bool


def _at(run: RunDtype, change: Change | None) -> RunDtype:
    """The precision a copy runs at: the run's, or the change's own dtype (``run in bf16``)."""

    dtype = getattr(change.apply, "run_dtype", None) if change else None
    return RD.of(dtype, run.recipe) if dtype else run


def _region_run(r: Region, run: RunDtype, change: Change | None) -> Outcome:
    """A copy of the region at ``run``'s precision (or the change's own dtype), the change applied."""

    at = _at(run, change)
    m, a, kw = copy_at(r.module, r.args, r.kwargs, at)
    ctx = change.apply(m, "", at) if change else contextlib.nullcontext()
    with ctx, precision(at):
        outs = _outputs(lambda: m(*a, **kw))
    return Outcome(outs, _finite(outs.values()))


def _model_run(model: nn.Module, batch: dict[str, Any], name: str, run: RunDtype, change: Change | None) -> Outcome:

    at = _at(run, change)
    m, _, kw = copy_at(model, (), batch, at)
    seen = {"finite": True}

    def watch_region(mod: nn.Module, args: Any, out: Any) -> None:
        seen["finite"] = seen["finite"] and _finite(t for _, t in float_tensors(out))

    h = (m.get_submodule(name) if name else m).register_forward_hook(watch_region)
    ctx = change.apply(m, name, at) if change else contextlib.nullcontext()
    try:
        with ctx, precision(at):
            outs = _outputs(lambda: m(**kw))
    finally:
        h.remove()
    return Outcome(outs, seen["finite"])


def _model_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())




def verify_fix(diagnosis: Diagnosis | None, region: Region | None, run: RunDtype, *,
               model: nn.Module | None = None, batch: dict[str, Any] | None = None,
               module_type: str | None = None) -> FixVerified | None:
    """The diagnosis' mechanical fix applied to a copy and re-run on the failing input: on the
    whole ``model`` with ``batch`` when both are given (and the model is small enough to copy),
    else on the ``region``. A change holds when the failing region's outputs (and the copy's) are
    finite with it, while an unchanged control copy still fails there. The first change that holds
    is reported, else the first tried. None when the cause has no mechanical fix, the control does
    not fail (nothing to verify against), or nothing could run (``verdict`` says which)."""
    return verdict(diagnosis, region, run, model=model, batch=batch, module_type=module_type)[0]


def verdict(diagnosis: Diagnosis | None, region: Region | None, run: RunDtype, *,
            model: nn.Module | None = None, batch: dict[str, Any] | None = None,
            module_type: str | None = None) -> tuple[FixVerified | None, str | None]:
    """``verify_fix``'s result and, when it is None, why (a key of ``UNVERIFIED``)."""
    if diagnosis is None:
        return None, None
    changes = _changes(diagnosis, run, module_type)
    if not changes:
        return None, "no_change"
    if region is None:
        return None, "not_rerun"
    whole = model is not None and batch is not None and _model_bytes(model) <= MODEL_COPY_LIMIT

    fp32 = RD.of("fp32", run.recipe)

    def run_copy(scope: str, at: RunDtype, change: Change | None) -> Outcome:
        return (_model_run(model, batch, region.name, at, change) if scope == "model"
                else _region_run(region, at, change))

    # a verification needs a failing control: the unchanged copy, at the run's precision, must
    # still fail at the failing region (else a finite result proves nothing about the change)
    control: dict[str, bool] = {}

    def fails(scope: str) -> bool:
        if scope not in control:
            try:
                control[scope] = not run_copy(scope, run, None).region_finite
            except Exception:  # noqa: BLE001 - the copy cannot run at all: no control in this scope
                control[scope] = False
        return control[scope]

    ref_cache: dict[str, dict[str, Any] | None] = {}
    results: list[FixVerified] = []
    no_control = False
    for ch in changes:
        scope = "model" if whole and ch.whole_model and fails("model") else "region"
        if not fails(scope):
            no_control = True
            continue
        try:
            if scope not in ref_cache:
                ref_cache[scope] = run_copy(scope, fp32, None).outputs
            got = run_copy(scope, run, ch)
        except _NotApplicable:
            continue
        except Exception:  # a change the model's code cannot take (mixed dtypes downstream...)
            continue
        fine = got.region_finite and _finite(got.outputs.values())
        fv = FixVerified(ch.text, fine, _rel(got.outputs, ref_cache[scope]), scope)
        if fv.finite:
            return fv, None
        results.append(fv)
    if results:
        return results[0], None
    return None, "control_finite" if no_control else "not_applicable"


def from_emulate_precision_casts(block: dict[str, Any] | None, rtol: float) -> FixVerified | None:
    """``scan --compile``'s re-run with ``emulate_precision_casts = True`` as a verified fix
    (finite: the compiled run is finite and within ``rtol`` of eager)."""
    if not block:
        return None
    err = block.get("max_rel_err")
    err = err if isinstance(err, float) and math.isfinite(err) else None
    ok = bool(block.get("compiled_finite")) and err is not None and err <= rtol
    return FixVerified("torch._inductor.config.emulate_precision_casts = True", ok, err, "model", "eager")


def with_verdict(diagnosis: Diagnosis, fv: FixVerified | None, why: str | None = None) -> Diagnosis:
    """Record ``fv`` (or, when None, ``why``: a key of ``UNVERIFIED``) on the diagnosis; its fix
    text says "verified" only when the fix made the failing input finite."""
    diagnosis.fix_verified = fv
    diagnosis.fix_unverified = why if fv is None else None
    if fv is not None and fv.finite:
        err = f", max rel err {fv.max_rel_err:.3g} vs {fv.reference}" if fv.max_rel_err is not None else ""
        diagnosis.fix += f" Verified: {fv.change} makes the failing input finite{err}."
    return diagnosis


def check(diagnosis: Diagnosis | None, region: Region | None, run: RunDtype, **kw: Any) -> None:
    """``verify_fix`` then ``with_verdict``: the one call each diagnosis point makes."""
    if diagnosis is None:
        return
    with_verdict(diagnosis, *verdict(diagnosis, region, run, **kw))
