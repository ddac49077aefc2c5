"""The one assembler: a located fault (and what a run recorded) into the report.

Every path that ends in a report comes through here — ``scan`` in each mode (forward,
``--generate``, ``--backward``, a capsule's step), ``check``'s forwards and ``watch().report()``:

- ``weights_section``: the report's ``weights`` block from a weights scan;
- ``run_info``: the typed ``run`` block (``report.RunInfo``) of a prepared run;
- ``near_misses``: module outputs close to the run's range, and absorbed intermediates;
- ``Located``: what a mode found about its first fault (``FirstNonfinite``, the op event, the
  replay, the precision the failing ops ran in, optimizer facts), in typed fields;
- ``diagnosis_of``: the one place a diagnosis is made from located evidence (keyword-only
  ``Evidence``); ``weights_only_diagnosis`` for a run that never ran the model;
- ``assemble``: ``first_nonfinite``, ``replay``, ``diagnosis`` and notes into a ``Report``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..report import Diagnosis, FirstNonfinite, Report, RunInfo

if TYPE_CHECKING:  # pragma: no cover
    from ..capture.ops import OpEvent
    from ..config import Config
    from ..dtypes import RunDtype
    from ..load.weights import WeightsScan
    from ..model.prepare import Prepared


def weights_section(ws: WeightsScan, cfg: Config) -> dict[str, Any]:
    """The report's ``weights`` block (contract v1 keys, plus the scan's extensions)."""
    from ..load.weights_sections import weights_sections

    frac = cfg.weights.near_overflow_fraction
    near = []
    for t in ws.tensors:
        if t.skipped or not t.finite:
            continue
        tight = {d: h for d, h in t.headroom.items() if h < 1 / frac}
        if tight:
            near.append({"name": t.name, "dtype": t.dtype, "absmax": t.absmax,
                         "overflows": [d for d, o in t.overflows.items() if o], "headroom": tight})
    sampled = any(t.sampled for t in ws.tensors)
    under = [t for t in ws.tensors if (t.fp16_zero_frac or 0) > 0.01]
    return {
        "n_tensors": ws.n_tensors,
        "nonfinite": [t.nonfinite_dict() for t in ws.nonfinite],
        "n_skipped": ws.n_skipped,
        "near_overflow": near,
        "fp16_underflow": [{"name": t.name, "zero_frac": t.fp16_zero_frac, "subnormal_frac": t.fp16_subnormal_frac,
                            "min_nonzero": t.min_nonzero} for t in under],
        "underflow_sampled": sampled,
        "tensors": [t.to_dict() for t in ws.tensors],
        **weights_sections(ws),  # unchecked, quantized, suspicious
    }


def run_info(p: Prepared, failed: list[int]) -> RunInfo:
    """The ``run`` block of a prepared run (modes add their own fields: ``generate``, ``loss``)."""
    return RunInfo(dtype=p.dtype, compute_dtype=p.run.compute, device=str(p.device), n_inputs=len(p.batches),
                   failed_inputs=list(failed), inputs=list(p.labels))


def input_rows(labels: list[str], failed: list[int]) -> list[dict[str, Any]]:
    """The report's ``inputs``: per input of the data set, its label and whether it stayed finite."""
    return [{"index": i, "label": lbl, "finite": i not in failed} for i, lbl in enumerate(labels)]


def failed_note(labels: list[str], failed: list[int]) -> str | None:
    if len(labels) > 1 and failed:
        return (f"{len(failed)} of {len(labels)} inputs produced non-finite values: "
                + ", ".join(f"#{i} {labels[i]}" for i in failed[:10]))
    return None


def near_misses(table: list[dict], run: RunDtype, cfg: Config, absorbed: list[Any]) -> list[dict]:
    """Module outputs within ``near_miss.overflow_fraction`` of the run's range (for an fp8 run,
    the compute dtype's: activations are stored there, only scaled matmul operands are fp8),
    and op results that went non-finite but were absorbed before any module output."""
    out: list[dict] = []
    frac = cfg.near_miss.overflow_fraction
    rng = run.range
    lim = rng.max
    run_dtype = run.name
    where = run_dtype if rng.name == run_dtype else f"{rng.name} (the {run_dtype} run's compute dtype)"
    for row in table:
        a = row.get("absmax")
        if a is not None and a > frac * lim and not (row["nan"] or row["posinf"] or row["neginf"]):
            out.append({"kind": "near_overflow", "module": row["module"], "module_type": row["module_type"],
                        "input_index": row["input_index"], "absmax": a, "limit": lim, "dtype": run_dtype,
                        "message": f"{row['module'] or '<root>'} output absmax {a:.4g} is {a / lim:.0%} of "
                                   f"{where} max {lim:.6g}"})
    for ev in absorbed:
        out.append({"kind": "absorbed", "module": ev.module, "op": ev.op, "dtype": run_dtype, "source": ev.source,
                    "message": f"{ev.op} in {ev.module or '<root>'} produced {ev.kind} "
                               f"({ev.nan} NaN, {ev.posinf} +inf, {ev.neginf} −inf) that was absorbed before any "
                               f"module output — {ev.outcome or 'the result is finite but silently wrong'}"})
    return out


@dataclass
class Located:
    """A mode's answer about its first fault, in typed fields (never in note text)."""

    first: FirstNonfinite
    run: RunDtype | None  # the precision the failing ops ran in (the run's, or the step's autocast)
    event: OpEvent | None = None  # the aten op that made it (None: arrived non-finite, or not re-run)
    replay: dict[str, dict] | None = None  # the failing region in every dtype (contract ``replay``)
    is_block: bool = False  # the module is one of the model's repeated blocks
    input_label: str | None = None
    optimizer_facts: dict[str, Any] | None = None  # optimizer faults: locate.training.optimizer_facts
    table: list[dict[str, Any]] | None = None  # module rows of the failing step, when located finer
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # mode fields for ``run`` (generate: the fault's token)
    region: tuple[Any, tuple, dict] | None = None  # (module, args, kwargs) of the failing call; this process only
    #: applies the diagnosis's fix to a copy and re-runs the failing input (``fix_check``); this process only
    verify_fix: Callable[[Diagnosis], None] | None = field(default=None, repr=False, compare=False)
    diagnosis: Diagnosis | None = None  # made already (by the rank that located it, verified there)


def diagnosis_of(loc: Located, cfg: Config | None, failed: list[int], n_inputs: int,
                 weights_nonfinite: list[dict] | None = None, replay: dict | None = None) -> Diagnosis | None:
    """The one place a located fault becomes a diagnosis (the rules of ``diagnose``); a parameter the
    diagnosis names as the cause becomes ``first_nonfinite.param``."""
    from .diagnose import Evidence, diagnose

    f, ev = loc.first, loc.event
    d = diagnose(Evidence(
        role=f.role, kind=f.kind, module=f.module, module_type=f.module_type, op=f.op,
        operands=ev.operands if ev is not None else [], dtype=loc.run,
        replay=replay if replay is not None else loc.replay, weights_nonfinite=weights_nonfinite or [],
        is_block=loc.is_block, input_label=loc.input_label, failed_inputs=list(failed), n_inputs=n_inputs,
        config=cfg.diagnosis if cfg is not None else None, op_absmax=ev.exact_absmax if ev is not None else None,
        phase=f.phase, grad_fn=f.grad_fn, optimizer=loc.optimizer_facts))
    if d is not None and d.param and f.param is None:
        f.param = d.param  # the parameter that does not fit the run's dtype (contract v1.3)
    return d


def weights_only_diagnosis(rep: Report, cfg: Config, ws: WeightsScan | None = None) -> Diagnosis | None:
    """The weights scan's own verdict: non-finite weights (``nonfinite_weights``), else bad
    quantization scales (``bad_scale``); None when the weights are clean."""
    from ..load.weights_sections import bad_scales
    from .diagnose import Evidence, diagnose

    bad = (rep.weights or {}).get("nonfinite") or []
    scales = bad_scales(ws) if ws is not None else []
    if not bad and not scales:
        return None
    return diagnose(Evidence(role=None, kind=None, module=None, module_type=None, op=None,
                             weights_nonfinite=bad, config=cfg.diagnosis, bad_scales=scales))


def diagnose_located(loc: Located, cfg: Config, failed: list[int], n_inputs: int,
                     weights_nonfinite: list[dict] | None = None) -> None:
    """``loc.diagnosis`` from its evidence, with its fix verified on a copy where one applies."""
    from ..progress import stage

    loc.diagnosis = diagnosis_of(loc, cfg, failed, n_inputs, weights_nonfinite)
    if loc.diagnosis is not None and loc.verify_fix is not None:
        with stage("fix"):
            loc.verify_fix(loc.diagnosis)


def assemble(rep: Report, loc: Located, cfg: Config) -> None:
    """``first_nonfinite``, ``replay``, ``diagnosis`` and the location's notes into ``rep``."""
    rep.first_nonfinite = loc.first
    rep.replay = loc.replay
    if loc.diagnosis is None:
        failed = rep.run.failed_inputs if rep.run is not None else []
        n = rep.run.n_inputs if rep.run is not None else 1
        diagnose_located(loc, cfg, failed, n, (rep.weights or {}).get("nonfinite") or [])
    rep.diagnosis = loc.diagnosis
    if loc.table is not None:
        rep.modules = loc.table
    rep.notes += [n for n in loc.notes if n not in rep.notes]
