"""The scan pipeline: load → weights scan → model + inputs → capture → locate → replay →
diagnose → report. The CLI and ``nan_hunter.scan`` both call ``scan`` here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .config import Config, as_config
from .diagnose import Evidence, diagnose
from .errors import BadInput
from .load import open_checkpoint
from .prepare import Prepared, parse_dtype, prepare
from .report import Report
from .weights import WeightsScan, scan_weights

if TYPE_CHECKING:  # pragma: no cover
    from .dtypes import RunDtype


def weights_block(ws: WeightsScan, cfg: Config) -> dict[str, Any]:
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
    }


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
                               f"module output — the result is finite but silently wrong"})
    return out


def run_block(p: Prepared, failed: list[int]) -> dict[str, Any]:
    return {"dtype": p.dtype, "device": str(p.device), "n_inputs": len(p.batches), "failed_inputs": failed,
            "inputs": p.labels}


def scan(checkpoint: str, arch: str | None = None, inputs: list[str] | None = None,
         prompts: list[str] | None = None, data: str | None = None, dtype: str | None = None,
         device: str = "auto", stats: str = "fast", config: str | Config | None = None, attn: str | None = None,
         progress: Callable[[str, int], None] | None = None, replay: bool = True) -> Report:
    cfg = as_config(config)
    parse_dtype(dtype)
    ck = open_checkpoint(checkpoint)
    if stats not in ("fast", "full"):
        raise BadInput(f"--stats {stats!r}: use fast or full")
    ws = scan_weights(ck, exact=stats == "full", progress=progress)
    rep = Report(checkpoint=ck.describe(), weights=weights_block(ws, cfg))
    prepared = prepare(ck, arch, inputs, prompts, data, dtype, device, cfg, attn)
    if prepared is None or not prepared.batches:
        rep.notes.append("weights-only scan: no --arch and no config.json, so nothing was run"
                         if prepared is None else prepared.notes[0])
        if ws.nonfinite:
            rep.diagnosis = diagnose(Evidence(None, None, None, None, None, weights_nonfinite=rep.weights["nonfinite"],
                                              config=cfg.diagnosis))
        return rep
    rep.notes += prepared.notes
    run_model(prepared, rep, replay=replay)
    return rep


def run_model(p: Prepared, rep: Report, replay: bool = True) -> None:
    """Capture, locate, replay and diagnose one prepared run into ``rep``."""
    from .capture.blocks import main_blocks
    from .execute import capture_run, forward
    from .locate.first_op import locate_op
    from .locate.producer import call_table, failed_inputs, first_finding, mask_notes, to_first_nonfinite
    from .replay import replay as do_replay

    cfg = p.cfg
    w = capture_run(p.model, p.batches, "modules", p.run)
    rows = w.sink.rows()
    finding = first_finding(w.calls, rows)
    failed = failed_inputs(w.calls, rows)
    rep.run = run_block(p, failed)
    rep.modules = call_table(w.calls, rows)
    rep.notes += mask_notes(w.calls, rows)
    rep.inputs = [{"index": i, "label": lbl, "finite": i not in failed} for i, lbl in enumerate(p.labels)]
    if finding is None:
        absorbed: list[Any] = []
        if cfg.near_miss.absorbed_intermediates:
            absorbed = capture_run(p.model, p.batches, "ops", p.run).op_records
        rep.near_misses = near_misses(rep.modules, p.run, cfg, absorbed)
        return
    call = finding.call
    kw = p.batches[call.input_index]
    ev, target, margs, mkw = locate_op(p.model, lambda: forward(p.model, kw, p.run), finding, p.run)
    rep.first_nonfinite = to_first_nonfinite(finding, ev)
    if replay and finding.role == "producer":
        rep.replay = do_replay(target, margs, mkw, p.run)
    evd = Evidence(finding.role, rep.first_nonfinite.kind, call.module, call.module_type, ev.op if ev else None,
                   ev.operands if ev else [], p.dtype, rep.replay, rep.weights["nonfinite"] if rep.weights else [],
                   call.module in set(main_blocks(p.model)), p.labels[call.input_index], failed, len(p.batches),
                   cfg.diagnosis)
    rep.diagnosis = diagnose(evd)
    if len(p.batches) > 1 and failed:
        rep.notes.append(f"{len(failed)} of {len(p.batches)} inputs produced non-finite values: "
                         + ", ".join(f"#{i} {p.labels[i]}" for i in failed[:10]))
