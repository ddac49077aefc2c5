"""Verified fixes (contract v1.2): the fix a diagnosis proposes, applied to a copy and re-run.

``verify_fix(diagnosis, region, run, whole=)`` picks the mechanical change for the
diagnosis' cause, applies it to a deep copy of the failing region (the module with the inputs
it was called with) — or, given the whole model and the failing input (``model.whole.WholeModel``),
to a fresh copy of the model whose weights are cast from full precision, as the user loads it —
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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import default_config
from ..dtypes import RunDtype as RD
from ..kernels.compare import compare
from ..locate.region import Region
from ..model.copy_run import copy_at, precision
from ..model.policy import apply_policy
from ..model.whole import COPY_LIMIT, WholeModel
from ..report import Diagnosis, FixVerified
from ..tree import float_tensors
from .fix_words import MECHANICAL, NO_FIX, UNVERIFIED, no_mechanical_fix
from .keep_fix import KeepFix, find_keep_set

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from ..dtypes import RunDtype

__all__ = [
    "MECHANICAL",
    "NO_FIX",
    "UNVERIFIED",
    "FixVerified",
    "Region",
    "Verdict",
    "from_emulate_precision_casts",
    "no_mechanical_fix",
    "verify_fix",
    "with_verdict",
]

#: attributes holding an epsilon, as torch and transformers name them
EPS_NAMES = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps", "norm_eps", "rms_norm_eps")
#: the largest model (parameter bytes) copied whole for a model-level check; bigger: the region only
MODEL_COPY_LIMIT = COPY_LIMIT


@dataclass(frozen=True)
class Change:
    """One mechanical fix: what it says, and how it is applied to a copy (a context to run the
    copy in, given the copy and the run's precision)."""

    text: str
    apply: Callable[[nn.Module, str, RunDtype], contextlib.AbstractContextManager[None]]
    whole_model: bool = True  # meaningful on a copy of the whole model (else: the region only)
    #: contract v1.4 ``applied_as``: kind policy | dtype | option | code, and its one value
    kind: str = "code"
    value: Any = None
    #: on the whole model, the keep set is searched (``keep_fix``: bisect's search), not this module alone
    keep_search: bool = False

    def applied_as(self, run: RunDtype, name: str) -> dict[str, Any]:
        """What the user applies (``FixVerified.applied_as``)."""
        if self.kind == "policy":
            return {
                "kind": "policy",
                "policy": self.value or {name: "fp32"},
                "dtype": run.name,
                "option": None,
            }
        if self.kind == "dtype":
            return {"kind": "dtype", "policy": None, "dtype": self.value, "option": None}
        return {"kind": self.kind, "policy": None, "dtype": None, "option": self.value}


# --- the changes ---------------------------------------------------------------------------------


def _keep(dtype: str) -> Callable[[nn.Module, str, RunDtype], contextlib.AbstractContextManager[None]]:
    @contextlib.contextmanager
    def apply(model: nn.Module, name: str, run: RunDtype) -> Iterator[None]:

        handle = apply_policy(model, {"dtype": run.name, "keep_dtype": dtype, "modules": {name: dtype}})
        try:
            yield
        finally:
            handle.remove()

    return apply


def _run_in(dtype: str) -> Callable[[nn.Module, str, RunDtype], contextlib.AbstractContextManager[None]]:
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

    ops = {
        torch.ops.aten._softmax.default,
        torch.ops.aten._log_softmax.default,
        torch.ops.aten._safe_softmax.default,
    }

    class SafeSoftmax(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            if func in ops:
                x, dim = args[0], args[1]
                masked = torch.isneginf(x).all(dim=dim, keepdim=True)
                out = out.masked_fill(masked, 0.0)
            return out

    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(
        False
    )  # nn.MultiheadAttention: the slow path, whose softmax this is
    try:
        with SafeSoftmax():  # type: ignore[no-untyped-call]  # torch's TorchDispatchMode.__init__: unannotated
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
        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            if func is torch.ops.aten.reciprocal.default:
                args = (clamp(args[0]),)
            elif func is torch.ops.aten.div.Tensor and isinstance(args[1], torch.Tensor):
                args = (args[0], clamp(args[1]))
            return func(*args, **(kwargs or {}))

    with ClampedScale():  # type: ignore[no-untyped-call]  # torch's TorchDispatchMode.__init__: unannotated
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
        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            nonlocal calls
            if func is sdpa:
                calls += 1
            return func(*args, **(kwargs or {}))

    with SeeSDPA():
        yield
    if not calls:
        raise _NotApplicable(
            "scaled_dot_product_attention never ran: the attention does not dispatch on the config"
        )


class _NotApplicable(Exception):
    """The change does not apply to this module (e.g. it has no eps attribute)."""


def _changes(d: Diagnosis, run: RunDtype, module_type: str | None) -> list[Change]:
    name = d.module or "the root module"
    keep32 = Change(f"keep {name} in fp32 (apply_policy)", _keep("fp32"), kind="policy", keep_search=True)
    # a transformers model in eager attention (else not applicable): the smallest change a user can make,
    # the run's dtype kept, so tried first where SDPA is the fix
    sdpa = Change(
        'attn_implementation="sdpa" instead of "eager"',
        _sdpa,
        kind="option",
        value='attn_implementation="sdpa"',
    )
    if d.cause == "overflow":
        if (
            run.is_fp8
        ):  # fp8 emulation covers every matmul of the run: keeping one module higher is not mechanical
            return []
        # chosen from the typed subject (contract v1.4), never from the summary's words
        bf16 = Change("run in bf16", _run_in("bf16"), kind="dtype", value="bf16")
        if d.subject == "attention_scores":
            changes = [sdpa, bf16, keep32] if run.compute != "bf16" else [sdpa, keep32, bf16]
        elif d.subject == "residual" and run.compute != "bf16":
            changes = [bf16, keep32]
        else:
            changes = [keep32, bf16] if run.compute != "fp32" else []
        # never the dtype the run already computed in: no change at all
        return [
            c
            for c in changes
            if not (c is keep32 and run.compute == "fp32" or c is bf16 and run.compute == "bf16")
        ]
    if d.cause == "division_by_zero":
        if d.dtype in ("fp32", "fp64"):  # the division already ran in fp32 (CPU autocast): no dtype helps
            return []
        return [
            Change(
                f"an eps {run.compute} can hold (≥ {run.range.smallest_normal:.2g}) in {name}",
                _eps_it_holds,
                kind="option",
                value=f"{name}: eps ≥ {run.range.smallest_normal:.2g}",
            ),
            keep32,
        ]
    if d.cause == "scale_underflow":
        return [
            Change(
                f"compute the scale in fp32 (keep {name} in fp32, apply_policy)", _keep("fp32"), kind="policy"
            ),
            Change(
                f"a clamped scale in {name} (|divisor| ≥ 1/{run.range.name} max)",
                _clamped_scale,
                whole_model=False,
            ),
        ]
    if d.cause == "masked_softmax":
        return [
            sdpa,
            Change(
                f"a safe softmax in {name} (a fully masked row gives zeros, as SDPA's)",
                _safe_softmax,
                kind="code",
            ),
        ]
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
    errs = [compare([outs[k]], [ref[k]]).finite_rel_err for k in keys]  # per output (keep_fix.output_error)
    known = [e for e in errs if e is not None]
    return max(known) if len(known) == len(errs) else None


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


def _model_run(whole: WholeModel, name: str, run: RunDtype, change: Change | None) -> Outcome:
    """A fresh copy of the whole model at ``run``'s precision (or the change's own dtype), its weights
    cast from full precision (``WholeModel.fresh``: as the user loads it), the change applied."""
    at = _at(run, change)
    m, a, kw = whole.fresh(at)
    seen = {"finite": True}

    def watch_region(mod: nn.Module, args: Any, out: Any) -> None:
        seen["finite"] = seen["finite"] and _finite(t for _, t in float_tensors(out))

    h = (m.get_submodule(name) if name else m).register_forward_hook(watch_region)
    ctx = change.apply(m, name, at) if change else contextlib.nullcontext()
    try:
        with ctx, precision(at):
            outs = _outputs(lambda: whole.call(m, a, kw))
    finally:
        h.remove()
    return Outcome(outs, seen["finite"])


def _model_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def verify_fix(
    diagnosis: Diagnosis | None,
    region: Region | None,
    run: RunDtype,
    *,
    model: nn.Module | None = None,
    batch: dict[str, Any] | None = None,
    module_type: str | None = None,
    whole: WholeModel | None = None,
) -> FixVerified | None:
    """The diagnosis' mechanical fix applied to a copy and re-run on the failing input: on the
    whole ``model`` with ``batch`` when both are given (and the model is small enough to copy),
    else on the ``region``. A change holds when the failing region's outputs (and the copy's) are
    finite with it, while an unchanged control copy still fails there. The first change that holds
    on the whole model is reported (else the first that holds on the region, else the first tried).
    None when the cause has no mechanical fix, the control does not fail (nothing to verify
    against), or nothing could run (``verdict`` says which). ``whole``: the model, the failing step's
    inputs and its full-precision weights (``model``/``batch``: a model whose weights are full precision)."""
    return verdict(
        diagnosis, region, run, model=model, batch=batch, module_type=module_type, whole=whole
    ).fix_verified


@dataclass
class Verdict:
    """Every change tried for a diagnosis: the one reported (``fix_verified``), why there is none
    (``why``: a key of ``UNVERIFIED``), the text saying how to apply it, and the others
    (``alternatives``, each with its own verification or null when it was not run)."""

    fix_verified: FixVerified | None = None
    why: str | None = None
    text: str | None = None
    alternatives: list[dict[str, Any]] = field(default_factory=list)


def _how(ch: Change, fv: FixVerified, run: RunDtype, name: str, kept: KeepFix | None) -> str:
    """How to apply a verified change, as the user will."""
    if fv.applied_as and fv.applied_as["kind"] == "policy":
        mods = list(fv.applied_as["policy"])
        pol = {"dtype": run.name, "keep_dtype": "fp32", "modules": fv.applied_as["policy"]}
        text = (
            f"Keep {', '.join(mods)} in fp32 with a policy: nan_hunter.apply_policy(model, {pol!r}) on the model "
            f"loaded at full precision (`nanhunter bisect --dtype {run.name} --policy-out keep.yaml` writes the "
            f"same policy as a file). Its hooks cast a kept module's inputs to fp32 and its output back to "
            f"{run.name} where it fits {run.name}'s range"
        )
        if kept is not None and kept.stayed_high:
            back = [m for m in mods if m not in kept.stayed_high]
            text += (
                f"; the output of {', '.join(kept.stayed_high)} does not fit and stays fp32 (torch's type "
                "promotion carries the activations on in fp32)"
                + (
                    f" until {back[-1]}, whose output returns to {run.name}"
                    if back
                    else ", to the model's outputs"
                )
            )
        return text + "."
    if fv.applied_as and fv.applied_as["kind"] == "dtype":
        dt = fv.applied_as["dtype"]
        t = f"torch.{_TORCH_NAMES.get(dt, dt)}"
        return (
            f"Run in {dt}: load or cast the model in {dt} ({_from_pretrained_keyword()}={t}, model.to({t})) "
            f"or run it under torch.autocast(dtype={t})."
        )
    if ch.value == 'attn_implementation="sdpa"':
        return (
            'Load the model with attn_implementation="sdpa" (or call model.set_attn_implementation("sdpa")): '
            "fused attention scales q before the matmul, keeping the run's dtype."
        )
    if ch.kind == "option":
        return f"Set {ch.value} (the dtype's smallest normal number, so the eps no longer rounds to zero)."
    return ch.text[0].upper() + ch.text[1:] + "."


def _alt(text: str, fv: FixVerified | None) -> dict[str, Any]:
    return {"fix": text, "fix_verified": fv}


def verdict(
    diagnosis: Diagnosis | None,
    region: Region | None,
    run: RunDtype,
    *,
    model: nn.Module | None = None,
    batch: dict[str, Any] | None = None,
    module_type: str | None = None,
    rtol: float | None = None,
    whole: WholeModel | None = None,
) -> Verdict:
    """Every mechanical change for the diagnosis tried on a copy (see ``verify_fix``). On the whole
    model, "keep in fp32" is the smallest keep set that makes the model's outputs finite and within
    ``rtol`` of fp32 (``keep_fix``: bisect's search), applied with ``apply_policy`` to a fresh copy.
    Every whole-model copy — the fp32 reference, the control, each change — is cast from the
    full-precision weights (``whole.master``), as the user loads the model at that dtype."""
    if diagnosis is None:
        return Verdict()
    changes = _changes(diagnosis, run, module_type)
    if not changes:
        return Verdict(why="no_change")
    if region is None:
        return Verdict(why="not_rerun")
    if whole is None and model is not None and batch is not None:
        whole = WholeModel(model, (), batch)
    if whole is not None and _model_bytes(whole.model) > MODEL_COPY_LIMIT:
        whole = None
    tol = rtol if rtol is not None else default_config().bisect.rtol

    fp32 = RD.of("fp32", run.recipe)

    def run_copy(scope: str, at: RunDtype, change: Change | None) -> Outcome:
        return (
            _model_run(whole, region.name, at, change)
            if scope == "model" and whole is not None
            else _region_run(region, at, change)
        )

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
    tried: list[tuple[Change, FixVerified | None, KeepFix | None]] = []
    no_control = False
    for ch in changes:
        scope = "model" if whole is not None and ch.whole_model and fails("model") else "region"
        if not fails(scope):
            no_control = True
            continue
        if ch.keep_search and scope == "model" and whole is not None:
            if any(fv is not None and fv.finite and fv.scope == "model" for _, fv, _ in tried):
                tried.append((ch, None, None))  # a keep search costs many runs: not run once a fix holds
                continue
            try:
                kept = find_keep_set(whole, run, region.name, tol)
            except Exception:  # noqa: BLE001 - the model's code cannot take the policy at all
                kept = None
            if kept is None:
                fv = FixVerified(ch.text, False, None, "model", applied_as=ch.applied_as(run, region.name))
            else:
                fv = FixVerified(
                    f"keep {', '.join(kept.keep)} in fp32 (apply_policy)",
                    kept.finite,
                    kept.max_rel_err,
                    "model",
                    applied_as=Change(
                        "", _keep("fp32"), kind="policy", value=dict(kept.policy["modules"])
                    ).applied_as(run, region.name),
                )
            tried.append((ch, fv, kept))
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
        rel = _rel(got.outputs, ref_cache[scope])
        if scope == "model" and rel is not None and rel > tol:
            # contract v1.4: verified = the model's outputs finite AND within the tolerance of fp32
            # (a finite answer far from fp32 is no fix; the fix oracle found bf16/SDPA at 0.45)
            fine = False
        tried.append(
            (ch, FixVerified(ch.text, fine, rel, scope, applied_as=ch.applied_as(run, region.name)), None)
        )
    ran = [(c, f, k) for c, f, k in tried if f is not None]
    if not ran:
        return Verdict(why="control_finite" if no_control else "not_applicable")
    order = [t for t in ran if t[1].finite and t[1].scope == "model"] + [t for t in ran if t[1].finite] + ran
    ch, fv, kept = order[0]
    text = _how(ch, fv, run, region.name, kept) if fv.finite and fv.scope == "model" else None
    alts = [
        _alt(
            _how(c, f, run, region.name, k) if f is not None and f.finite and f.scope == "model" else c.text,
            f,
        )
        for c, f, k in tried
        if c is not ch
    ]
    return Verdict(fv, None, text, alts)


def from_emulate_precision_casts(block: dict[str, Any] | None, rtol: float) -> FixVerified | None:
    """``scan --compile``'s re-run with ``emulate_precision_casts = True`` as a verified fix
    (finite: the compiled run is finite and within ``rtol`` of eager)."""
    if not block:
        return None
    err = block.get("max_rel_err")
    err = err if isinstance(err, float) and math.isfinite(err) else None
    ok = bool(block.get("compiled_finite")) and err is not None and err <= rtol
    return FixVerified(
        "torch._inductor.config.emulate_precision_casts = True",
        ok,
        err,
        "model",
        "eager",
        applied_as={
            "kind": "option",
            "policy": None,
            "dtype": None,
            "option": "torch._inductor.config.emulate_precision_casts = True",
        },
    )


def with_verdict(diagnosis: Diagnosis, fv: FixVerified | Verdict | None, why: str | None = None) -> Diagnosis:
    """Record the verdict (or a bare ``fv`` and, when None, ``why``: a key of ``UNVERIFIED``) on the
    diagnosis. Its fix text says "Verified" only for a fix applied to the whole model whose outputs
    were finite (contract v1.4): the text is then that fix's, said as the user applies it, and the
    rule's other advice moves to ``alternatives`` (unverified), never merged into it."""
    v = fv if isinstance(fv, Verdict) else Verdict(fv, why if fv is None else None)
    fv = v.fix_verified
    diagnosis.fix_verified = fv
    diagnosis.fix_unverified = v.why if fv is None else None
    diagnosis.alternatives = list(v.alternatives)
    if fv is not None and fv.finite and fv.scope == "model":
        err = f", max rel err {fv.max_rel_err:.3g} vs {fv.reference}" if fv.max_rel_err is not None else ""
        if v.text is not None:
            diagnosis.alternatives.append(_alt(diagnosis.fix, None))
            diagnosis.fix = v.text
        diagnosis.fix += f" Verified: {fv.change} makes the model's outputs finite{err}."
    return diagnosis


def check(diagnosis: Diagnosis | None, region: Region | None, run: RunDtype, **kw: Any) -> None:
    """``verdict`` then ``with_verdict``: the one call each diagnosis point makes."""
    if diagnosis is None:
        return
    with_verdict(diagnosis, verdict(diagnosis, region, run, **kw))


#: a run dtype's torch name, for the printed fix
_TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _from_pretrained_keyword() -> str:
    """The dtype keyword of the installed transformers' ``from_pretrained`` (``dtype`` from 4.56 on,
    ``torch_dtype`` before), so the printed fix runs as printed; ``dtype`` without transformers."""
    try:
        from ..model.placement import dtype_keyword  # lazy: imports transformers

        return dtype_keyword()
    except ImportError:
        return "dtype"
