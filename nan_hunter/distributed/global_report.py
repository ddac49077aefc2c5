"""``watch().report()`` under torch.distributed: one global answer on every rank.

Capture stays rank-local and adds no collective per forward; ``report()`` is the collective, for
the watches ``nan_hunter.watch()`` makes (``collective``): the CLI's own watches stay per rank.
Every rank locates its own first fault as a single process would (``session.Watch._locate``),
then ``combine`` gathers each rank's summary (JSON over tensors, ``dist.all_gather_json``: no
pickle) and every rank picks the same first fault: earliest step, then execution order within
the step (forward < backward < optimizer; modules in order), then the lowest rank. For a fault
in the weights of an FSDP2 parameter (a ``DTensor``), the rank is the one whose local shard
holds the parameter's first non-finite element (each rank reads only its own shard,
``to_local()``; one more gather of one integer per rank). The chosen rank's ``run`` and
``diagnosis`` come with the gather; module statistics (``calls``, ``aggregates``) stay each
rank's own.

Re-runs: a report re-runs a failing forward on the rank that saw it, alone. Under FSDP2 a
forward would all-gather parameters (a collective the other ranks do not join), so
``local_reruns`` first unshards every FSDP module on every rank (one collective, at report time;
the full model is then held once per rank while the report runs) and lifts FSDP's forward hooks
for the duration, so a re-run runs on the gathered weights with no collective. DDP re-runs the
inner module, which has no collective in its forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..locate.producer import first_finding
from ..report import Diagnosis, FirstNonfinite, FixVerified, RunInfo
from . import collectives as dist

if TYPE_CHECKING:
    import torch
    from torch import nn

PHASES = ("forward", "backward", "optimizer")


def _fsdp_modules(model: nn.Module) -> list[nn.Module]:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a build without torch.distributed
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _is_fsdp_hook(hook: Any) -> bool:
    """FSDP's own forward hooks (bound methods of its state, or the closures of grouped
    ``fully_shard([a, b])``), known by the module that defines them."""
    fn = getattr(hook, "__func__", hook)
    return (getattr(fn, "__module__", None) or "").startswith("torch.distributed.fsdp")


@contextlib.contextmanager
def local_reruns(watch: Any) -> Iterator[None]:
    """While ``watch`` (a ``session.Watch``) reports: under FSDP2, when any rank may re-run a
    forward, every rank unshards every FSDP module (the all-gathers a forward would do, done once,
    together) and FSDP's forward hooks are lifted, so a rank's re-runs issue no collective; on exit
    the hooks are put back as they were and the parameters resharded. Elsewhere: nothing."""
    fsdp = _fsdp_modules(watch.model) if collective(watch) else []
    if not fsdp:
        yield
        return

    # any fault this rank knows of may be re-run (forward, backward): better an unneeded unshard than a hang
    will_rerun = bool(watch.failed_forwards()) or first_finding(watch.calls, watch.sink.rows()) is not None
    if not any(dist.all_gather_json(will_rerun)):
        yield
        return
    saved: list[tuple[dict[int, Any], dict[int, Any]]] = []
    try:
        for m in fsdp:  # the same modules in the same order on every rank: matching all-gathers
            m.unshard()  # type: ignore[operator]
        for m in fsdp:
            pre, post = m._forward_pre_hooks, m._forward_hooks
            saved.append((dict(pre), dict(post)))
            for d in (pre, post):
                for i in [i for i, h in d.items() if _is_fsdp_hook(h)]:
                    del d[i]
        yield
    finally:
        for m, (pre, post) in zip(fsdp, saved):
            for d, old in ((m._forward_pre_hooks, pre), (m._forward_hooks, post)):
                d.clear()
                d.update(old)
        for m in fsdp:
            m.reshard()  # type: ignore[operator]


def _module_order(model: nn.Module) -> dict[str, int]:
    return {name: i for i, (name, _) in enumerate(model.named_modules())}


def _param_of(fnf: FirstNonfinite, model: nn.Module) -> str | None:
    """The dotted parameter name (as in ``named_parameters()``) a weights fault is in."""
    if fnf.param:
        return fnf.param
    if fnf.role != "weights" or not fnf.tensor:
        return None
    name = f"{fnf.module}.{fnf.tensor}" if fnf.module else fnf.tensor
    return name if name in dict(model.named_parameters()) else None


def _order_key(s: dict[str, Any], modules: dict[str, int], params: dict[str, int]) -> tuple:
    """(step, phase, position within the phase, rank): the global order of first faults."""
    f = s["first_nonfinite"]
    phase = PHASES.index(f["phase"]) if f.get("phase") in PHASES else len(PHASES)
    if f.get("phase") == "optimizer" and f.get("param") in params:
        pos = params[f["param"]]
    else:
        pos = modules.get(f["module"], len(modules))
        if f["module"] == "" and f["role"] != "input":
            pos = len(modules)  # the root's own ops: after its children (head, final norm)
        if f.get("phase") == "backward":
            pos = -pos  # backward runs the modules in reverse
    return (f["step"], phase, pos, s["rank"])


def _first_bad_flat_index(p: torch.Tensor) -> int | None:
    """Index, in the full parameter (row-major), of the first non-finite element of this rank's
    shard of ``p`` (a DTensor; read with ``to_local()``: no collective), or None."""
    import torch

    local = p.to_local().detach()  # type: ignore[attr-defined]
    bad = ~torch.isfinite(local.reshape(-1))
    if local.numel() == 0 or not bool(bad.any()):
        return None
    i = int(bad.nonzero()[0, 0])
    idx = list(_unravel(i, tuple(local.shape)))
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)  # type: ignore
    except Exception:  # noqa: BLE001 - private helper gone: FSDP2's even chunks along dim 0
        chunk = math.ceil(p.shape[0] / dist.world()) if p.dim() else 0
        offset = (dist.rank() * chunk,) + (0,) * (p.dim() - 1)
    flat = 0
    for size, j, off in zip(p.shape, idx, offset):
        flat = flat * size + j + off
    return flat


def _unravel(i: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(i % size if size else 0)
        i = i // size if size else 0
    return out[::-1]


def _sharded_param(model: nn.Module, name: str) -> Any:
    """The parameter ``name`` as a DTensor (FSDP2's sharded form), or None when it is not sharded."""
    for m in _fsdp_modules(model):
        m.reshard()  # type: ignore[operator]  # no collective: frees gathered copies, registers shards
    try:
        p = model.get_parameter(name)
    except AttributeError:
        return None
    return p if hasattr(p, "to_local") and hasattr(p, "placements") else None


def _shard_owner(model: nn.Module, name: str) -> int | None:
    """The rank whose local shard holds the first non-finite element of parameter ``name``
    (collective; every rank calls it for the same name), or None when it is not sharded."""
    p = _sharded_param(model, name)
    first = _first_bad_flat_index(p) if p is not None else None
    found = [(i, r) for r, i in enumerate(dist.all_gather_json(first)) if i is not None]
    return min(found)[1] if found else None


def collective(watch: Any) -> bool:
    """Whether ``watch``'s report is global: a ``nan_hunter.watch()`` (the public API marks its
    watches) under a process group of more than one rank. The CLI's own watches (``--generate``
    on a rank's share of a split data set) stay per rank: ranks may call them unequally often."""
    return bool(getattr(watch, "collective", False)) and dist.active()


def combine(local: Any, watch: Any) -> Any:
    """The global ``WatchReport`` every rank gets from its own ``local`` one (collective: every
    rank must call it); ``local`` unchanged when ``collective(watch)`` is false. The chosen rank's
    ``run`` (its ``failed_inputs`` too: steps are numbered per rank) and ``diagnosis`` come with the
    gather; each rank's first fault and failing steps are in ``ranks``."""
    if not collective(watch):
        return local
    model = watch.model
    me = dist.rank()
    fnf = local.first_nonfinite
    if fnf is not None:
        fnf = dataclasses.replace(fnf, rank=me, param=_param_of(fnf, model))
    mine = {
        "rank": me,
        "first_nonfinite": dataclasses.asdict(fnf) if fnf else None,
        "failed_inputs": list(local.failed_inputs),
        "notes": list(local.notes),
        "run": local.run.to_dict() if local.run is not None else None,
        "diagnosis": dataclasses.asdict(local.diagnosis) if local.diagnosis else None,
    }
    everyone = dist.all_gather_json(mine)
    modules = _module_order(model)
    params = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    faulty = sorted(
        (s for s in everyone if s["first_nonfinite"] is not None),
        key=lambda s: _order_key(s, modules, params),
    )
    chosen = faulty[0] if faulty else None
    if (
        chosen is not None
        and chosen["first_nonfinite"]["role"] == "weights"
        and chosen["first_nonfinite"]["param"]
    ):
        owner = _shard_owner(model, chosen["first_nonfinite"]["param"])
        if owner is not None and owner != chosen["rank"]:
            same = [s for s in faulty if s["rank"] == owner]
            if same and same[0]["first_nonfinite"]["param"] == chosen["first_nonfinite"]["param"]:
                chosen = same[0]  # that rank saw the same fault: its own location and diagnosis
            else:
                chosen = {**chosen, "first_nonfinite": {**chosen["first_nonfinite"], "rank": owner}}
    notes = list(local.notes) if chosen is None or chosen["rank"] == me else list(chosen["notes"])
    if chosen is not None:
        notes = [f"rank {chosen['rank']}: {n}" for n in notes]
    for s in everyone:
        if chosen is not None and s["rank"] == chosen["rank"]:
            continue
        notes += [f"rank {s['rank']}: {n}" for n in s["notes"]]
    for s in everyone:
        if s["first_nonfinite"] is not None and s["first_nonfinite"].get("reproducible") is False:
            notes.append(
                f"rank {s['rank']}: its fault did not come back when that forward was re-run on the "
                "same inputs and weights: suspect non-determinism or the hardware of rank "
                f"{s['rank']} (a flipped bit, a failing device), not the numerics of the model"
            )
    first = FirstNonfinite(**chosen["first_nonfinite"]) if chosen is not None else None
    diag = chosen["diagnosis"] if chosen is not None else None
    # the chosen rank's run block: its steps are the ones first_nonfinite.step counts (each rank
    # numbers its own forwards; every rank's failing steps are in ``ranks``)
    run = _run_info(chosen["run"] if chosen is not None else everyone[0]["run"])
    return local.replaced(
        located=local.located if chosen is not None and chosen["rank"] == me else None,
        ranks=[
            {"rank": s["rank"], "first_nonfinite": s["first_nonfinite"], "failed_inputs": s["failed_inputs"]}
            for s in everyone
        ],
        first_nonfinite=first,
        notes=notes,
        run=run,
        diagnosis=diagnosis_from_json(diag),
    )


def _run_info(d: dict[str, Any] | None) -> RunInfo | None:
    """A ``run`` block that crossed ranks as JSON, typed again."""
    return RunInfo(**d) if d is not None else None


def diagnosis_from_json(d: dict[str, Any] | None) -> Diagnosis | None:
    """A diagnosis that crossed ranks as JSON, typed again (its verified fix too)."""
    if d is None:
        return None
    fv = d.get("fix_verified")
    return Diagnosis(**{**d, "fix_verified": FixVerified(**fv) if fv else None})
