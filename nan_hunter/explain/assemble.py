"""The one assembler: a located fault (and what a run recorded) into the report.

Every path that ends in a report comes through here — ``scan`` in each mode (forward,
``--generate``, ``--backward``, a capsule's step), ``check``'s forwards, ``watch().report()``, the
framework callbacks (which keep a watch's report) and the ranks of a split run:

- ``run_info``: the one constructor of the typed ``run`` block (``report.RunInfo``);
- ``near_misses``: module outputs close to the run's range, and absorbed intermediates;
- ``explain``: a ``locate.located.Located`` replayed in every dtype (``replay_region``), diagnosed
  (``diagnosis_of``, the one place a diagnosis is made from located evidence) and its fix verified
  on a copy (``fix_check``) — once, whoever located it; a fault that did not come back on its
  re-run becomes ``not_reproducible``; ``compile_verdict`` for a compiled run that parts from a
  healthy eager one (the weights scan's own block and verdict: ``explain.weights_verdict``, which
  imports no torch);
- ``assemble``: ``first_nonfinite``, ``replay``, ``diagnosis`` and notes into a ``Report``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ..dtypes import canonical
from ..locate.located import Located
from ..locate.region import BackwardRegion, OptimizerRegion, Region
from ..progress import stage
from ..report import Diagnosis, ModuleRow, ReplayRow, Report, RunInfo
from . import fix_check
from .diagnose import Evidence, diagnose, not_reproducible
from .replay import backward_replay, optimizer_replay, replay

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config
    from ..dtypes import RunDtype

__all__ = [
    "Located",
    "assemble",
    "diagnosis_of",
    "explain",
    "failed_note",
    "input_rows",
    "near_misses",
    "replay_region",
    "run_info",
    "compile_verdict",
]


def run_info(run: RunDtype | None, device: Any, n_inputs: int, failed: list[int], **fields: Any) -> RunInfo:
    """The ``run`` block, built here and only here: the precision the run computed in (its name
    and compute dtype), the device, how many inputs (or forwards) ran and which went non-finite;
    ``fields``: what the run adds (``inputs``, ``backward``, ``optimizer_steps``, ``autocast``...)."""
    return RunInfo(
        dtype=run.name if run is not None else None,
        compute_dtype=run.compute if run is not None else None,
        device=str(device),
        n_inputs=n_inputs,
        failed_inputs=list(failed),
        **fields,
    )


def input_rows(labels: list[str], failed: list[int]) -> list[dict[str, Any]]:
    """The report's ``inputs``: per input of the data set, its label and whether it stayed finite."""
    return [{"index": i, "label": lbl, "finite": i not in failed} for i, lbl in enumerate(labels)]


def failed_note(labels: list[str], failed: list[int]) -> str | None:
    if len(labels) > 1 and failed:
        return f"{len(failed)} of {len(labels)} inputs produced non-finite values: " + ", ".join(
            f"#{i} {labels[i]}" for i in failed[:10]
        )
    return None


def near_misses(
    table: list[ModuleRow], run: RunDtype, cfg: Config, absorbed: list[Any]
) -> list[dict[str, Any]]:
    """Module outputs within ``near_miss.overflow_fraction`` of the run's range (for an fp8 run,
    the compute dtype's: activations are stored there, only scaled matmul operands are fp8),
    and op results that went non-finite but were absorbed before any module output."""
    out: list[dict[str, Any]] = []
    frac = cfg.near_miss.overflow_fraction
    rng = run.range
    lim = rng.max
    run_dtype = run.name
    where = run_dtype if rng.name == run_dtype else f"{rng.name} (the {run_dtype} run's compute dtype)"
    for row in table:
        a = row.get("absmax")
        if a is not None and a > frac * lim and not (row["nan"] or row["posinf"] or row["neginf"]):
            out.append(
                {
                    "kind": "near_overflow",
                    "module": row["module"],
                    "module_type": row["module_type"],
                    "input_index": row["input_index"],
                    "absmax": a,
                    "limit": lim,
                    "dtype": run_dtype,
                    "message": f"{row['module'] or '<root>'} output absmax {a:.4g} is {a / lim:.0%} of "
                    f"{where} max {lim:.6g}",
                }
            )
    for ev in absorbed:
        out.append(
            {
                "kind": "absorbed",
                "module": ev.module,
                "op": ev.op,
                "dtype": run_dtype,
                "source": ev.source,
                "message": f"{ev.op} in {ev.module or '<root>'} produced {ev.kind} "
                f"({ev.nan} NaN, {ev.posinf} +inf, {ev.neginf} −inf) that was absorbed before any "
                f"module output — {ev.outcome or 'the result is finite but silently wrong'}",
            }
        )
    return out


def diagnosis_of(
    loc: Located,
    cfg: Config | None,
    failed: list[int],
    n_inputs: int,
    weights_nonfinite: list[dict[str, Any]] | None = None,
    replay: dict[str, ReplayRow] | None = None,
) -> Diagnosis | None:
    """The one place a located fault becomes a diagnosis (the rules of ``diagnose``); a parameter the
    diagnosis names as the cause becomes ``first_nonfinite.param``."""

    f, ev = loc.first, loc.event
    d = diagnose(
        Evidence(
            role=f.role,
            kind=f.kind,
            module=f.module,
            module_type=f.module_type,
            op=f.op,
            operands=ev.operands if ev is not None else [],
            dtype=loc.run,
            replay=replay if replay is not None else loc.replay,
            weights_nonfinite=weights_nonfinite or [],
            is_block=loc.is_block,
            input_label=loc.input_label,
            failed_inputs=list(failed),
            n_inputs=n_inputs,
            config=cfg.diagnosis if cfg is not None else None,
            op_absmax=ev.exact_absmax if ev is not None else None,
            phase=f.phase,
            grad_fn=f.grad_fn,
            optimizer=loc.optimizer_facts,
            mechanism=ev.mechanism if ev is not None else None,
            op_dtype=op_dtype(loc),
        )
    )
    if d is not None and d.param and f.param is None:
        f.param = d.param  # the parameter that does not fit the run's dtype (contract v1.3)
    return d


def op_dtype(loc: Located) -> str | None:
    """The dtype the located op computed in (contract v1.4 ``first_nonfinite.dtype``): its output's,
    under autocast too (CPU autocast leaves div/std in fp32); without an op, the run's compute dtype
    for a producer, else None."""
    ev = loc.event
    if ev is not None and ev.out_dtype:
        try:
            return canonical(ev.out_dtype)
        except (KeyError, ValueError):
            return ev.out_dtype
    if loc.first.role == "producer" and loc.run is not None:
        return loc.run.compute
    return None


def compile_verdict(
    rep: Report,
    run: RunDtype,
    cfg: Config,
    kind: str | None,
    module: str,
    module_type: str,
    evidence: dict[str, Any],
    emulated: dict[str, Any] | None,
    rtol: float,
) -> None:
    """``rep.diagnosis`` of ``scan --compile`` when the compiled run parts from a healthy eager one
    (``compile_divergence``), its fix verified by the run with ``emulate_precision_casts``."""
    rep.diagnosis = diagnose(
        Evidence(
            role=None,
            kind=kind,
            module=module,
            module_type=module_type,
            op=None,
            dtype=run,
            config=cfg.diagnosis,
            compile=evidence,
        )
    )
    if rep.diagnosis is not None:
        fix_check.with_verdict(rep.diagnosis, fix_check.from_emulate_precision_casts(emulated, rtol))


def replay_region(
    region: Region | BackwardRegion | OptimizerRegion, run: RunDtype | None
) -> dict[str, ReplayRow]:
    """The failing region re-run in every dtype against float64 (``replay``): a forward call, a
    backward call from the gradients at its outputs, or one parameter's optimizer step."""
    if isinstance(region, Region):
        return replay(region.module, region.args, region.kwargs, run)
    if isinstance(region, BackwardRegion):
        return backward_replay(region.module, region.args, region.kwargs, region.grads, run)
    o = region.pieces
    name = region.param
    return optimizer_replay(
        o.cls, o.hyper[o.groups.get(name, 0)], o.weights[name], o.grads[name], o.state.get(name, {}), run
    )


def explain(
    loc: Located,
    cfg: Config | None,
    failed: list[int],
    n_inputs: int,
    weights_nonfinite: list[dict[str, Any]] | None = None,
    replay: bool = True,
    device: str | None = None,
    rank: int | None = None,
) -> None:
    """``loc.replay``, ``loc.diagnosis`` and its verified fix, made once (a located fault that has
    them already, from the rank that located it, is left as it is). ``replay``: re-run the region
    in every dtype (``--no-replay``: not). ``device``/``rank``: where the re-runs ran, named by the
    ``not_reproducible`` cause when the fault did not come back."""
    if loc.diagnosis is not None:
        return
    f, region = loc.first, loc.region
    if replay and region is not None and f.role == "producer" and loc.replay is None:
        with stage("replay"), region.around():
            try:
                loc.replay = replay_region(region, loc.run)
            except Exception as e:  # noqa: BLE001 - the report stands without its replay; it says why
                msg = str(e).splitlines()[0] if str(e) else ""
                loc.notes.append(
                    f"the replay of {f.module or '<root>'} ({f.phase}) could not be run: "
                    f"{type(e).__name__}: {msg}"
                )
    loc.diagnosis = diagnosis_of(loc, cfg, failed, n_inputs, weights_nonfinite)
    if loc.diagnosis is not None and loc.run is not None:
        # only a forward call is re-run with a fix applied; any other fault's fix says why it is unverified
        call = region if isinstance(region, Region) else None
        whole = call.whole if call is not None else None
        with stage("fix"), call.around() if call is not None else contextlib.nullcontext():
            fix_check.check(loc.diagnosis, call, loc.run, whole=whole)
    if f.reproducible is False:
        # the fault did not come back when its region was re-run: numerics do not explain it
        dtype = loc.diagnosis.dtype if loc.diagnosis is not None else (loc.run.name if loc.run else None)
        loc.diagnosis = not_reproducible(f.module, f.op, dtype, f.kind, device or "?", rank, loc.diagnosis)


def assemble(
    rep: Report,
    loc: Located,
    cfg: Config | None,
    replay: bool = True,
    device: str | None = None,
    rank: int | None = None,
) -> None:
    """``first_nonfinite``, ``replay``, ``diagnosis`` and the location's notes into ``rep`` (the
    located fault explained first, once: ``explain``)."""
    failed = rep.run.failed_inputs if rep.run is not None else []
    n = rep.run.n_inputs if rep.run is not None else 1
    explain(loc, cfg, failed, n, (rep.weights or {}).get("nonfinite") or [], replay, device, rank)
    rep.first_nonfinite = loc.first
    if loc.first.dtype is None:
        loc.first.dtype = op_dtype(loc)
    rep.replay = loc.replay
    rep.diagnosis = loc.diagnosis
    rep.notes += [n for n in loc.notes if n not in rep.notes]
