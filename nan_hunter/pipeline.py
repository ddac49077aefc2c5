"""The scan pipeline: load → weights scan → model + inputs → capture → locate → replay →
diagnose → report. The CLI and ``nan_hunter.scan`` both call ``scan`` here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .config import load_config
from .diagnose import Evidence, diagnose
from .dtypes import canonical, is_fp8, limits, name_of
from .errors import BadInput
from .load import Checkpoint, open_checkpoint
from .report import Report
from .weights import WeightsScan, scan_weights

DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog."


@dataclass
class Prepared:
    """Everything a run needs, built once (scan, bisect and check share it)."""

    ck: Checkpoint
    model: Any
    tokenizer: Any
    how: str | None
    batches: list[Any]
    labels: list[str]
    dtype: str | None
    device: Any
    cfg: dict
    notes: list[str] = field(default_factory=list)


def checkpoint_dtype(ck: Checkpoint) -> str | None:
    counts: Counter = Counter()
    for name in ck.names():
        e = ck.entries.get(name)
        tag = e.dtype if e else None
        m = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "F64": "fp32"}.get(tag or "")
        if m is None and e is None:
            m = name_of(ck.tensor(name).dtype)
        if m in ("fp32", "fp16", "bf16"):
            counts[m] += e.numel if e else 1
    return counts.most_common(1)[0][0] if counts else None


def parse_dtype(dtype: str | None, flag: str = "--dtype") -> str | None:
    """A user's dtype name → its canonical run dtype; exit 2 (BadInput) for anything else."""
    if dtype is None:
        return None
    from .dtypes import RUN_DTYPES, UnknownDtype

    try:
        d = canonical(dtype)
    except UnknownDtype as e:
        raise BadInput(f"{flag}: {e}") from None
    if d not in RUN_DTYPES:
        raise BadInput(f"{flag}: {dtype!r} cannot be run; use one of {', '.join(RUN_DTYPES)}")
    return d


def prepare(ck: Checkpoint, arch: str | None, inputs: list[str] | None, prompts: list[str] | None,
            data: str | None, dtype: str | None, device: str, cfg: dict, attn: str | None = None,
            need_model: bool = False) -> Prepared | None:
    from .build import build_model
    from .inputs import build_batches
    from .runner import cast_batch, cast_model, resolve_device

    dt = parse_dtype(dtype)
    dev = resolve_device(device)
    model, tok, how = build_model(ck, arch, attn)
    if model is None:
        if inputs or prompts or data:
            raise BadInput("inputs were given but no model can be built: pass --arch file.py:factory "
                           "(or use a Hugging Face directory with config.json)")
        if need_model:
            raise BadInput("this command needs a model: pass --arch file.py:factory or a Hugging Face directory")
        return None
    notes = []
    batches = build_batches(model, tok, inputs, prompts, data)
    if not batches:
        if tok is None:
            if need_model:
                raise BadInput("no inputs: pass --inputs FILE.safetensors (or --prompt/--data with a tokenizer)")
            return Prepared(ck, model, tok, how, [], [], dt, dev, cfg,
                            ["model built, but no inputs given: weights-only scan "
                             "(pass --inputs, --prompt or --data to run it)"])
        batches = build_batches(model, tok, None, [DEFAULT_PROMPT], None)
        notes.append(f"no inputs given: ran the default prompt {DEFAULT_PROMPT!r}")
    run_dtype = dt or checkpoint_dtype(ck) or "fp32"
    model = cast_model(model, run_dtype, dev)
    kw = [cast_batch(b.kwargs, run_dtype, dev) for b in batches]
    return Prepared(ck, model, tok, how, kw, [b.label for b in batches], run_dtype, dev, cfg, notes)


def weights_block(ws: WeightsScan, cfg: dict) -> dict[str, Any]:
    frac = float(cfg["weights"]["near_overflow_fraction"])
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


def near_misses(table: list[dict], run_dtype: str, cfg: dict, absorbed: list[Any]) -> list[dict]:
    out: list[dict] = []
    frac = float(cfg["near_miss"]["overflow_fraction"])
    lim = limits(run_dtype if not is_fp8(run_dtype) else run_dtype).max
    for row in table:
        a = row.get("absmax")
        if a is not None and a > frac * lim and not (row["nan"] or row["posinf"] or row["neginf"]):
            out.append({"kind": "near_overflow", "module": row["module"], "module_type": row["module_type"],
                        "input_index": row["input_index"], "absmax": a, "limit": lim, "dtype": run_dtype,
                        "message": f"{row['module'] or '<root>'} output absmax {a:.4g} is {a / lim:.0%} of "
                                   f"{run_dtype} max {lim:.6g}"})
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
         device: str = "auto", stats: str = "fast", config: str | None = None, attn: str | None = None,
         progress: Callable[[str, int], None] | None = None, replay: bool = True) -> Report:
    cfg = load_config(config)
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
                                              config=cfg["diagnosis"]))
        return rep
    rep.notes += prepared.notes
    run_model(prepared, rep, replay=replay)
    return rep


def run_model(p: Prepared, rep: Report, replay: bool = True) -> None:
    """Capture, locate, replay and diagnose one prepared run into ``rep``."""
    from .capture import main_blocks
    from .fp8 import fp8_options
    from .locate import call_table, failed_inputs, first_finding, mask_notes, to_first_nonfinite
    from .replay import replay as do_replay
    from .runner import capture_run, forward, locate_op

    cfg = p.cfg
    f8 = fp8_options(cfg)
    w = capture_run(p.model, p.batches, "modules", p.dtype, f8)
    finding = first_finding(w)
    failed = failed_inputs(w)
    rep.run = run_block(p, failed)
    rep.modules = call_table(w)
    rep.notes += mask_notes(w)
    rep.inputs = [{"index": i, "label": lbl, "finite": i not in failed} for i, lbl in enumerate(p.labels)]
    if finding is None:
        absorbed: list[Any] = []
        if cfg["near_miss"].get("absorbed_intermediates"):
            wo = capture_run(p.model, p.batches, "ops", p.dtype, f8)
            absorbed = wo.op_records
        rep.near_misses = near_misses(rep.modules, p.dtype, cfg, absorbed)
        return
    call = finding.call
    kw = p.batches[call.input_index]
    ev, target, margs, mkw = locate_op(p.model, lambda: forward(p.model, kw, p.dtype, f8), finding, p.dtype, f8)
    rep.first_nonfinite = to_first_nonfinite(finding, ev)
    if replay and finding.role == "producer":
        rep.replay = do_replay(target, margs, mkw, f8)
    evd = Evidence(finding.role, rep.first_nonfinite.kind, call.module, call.module_type, ev.op if ev else None,
                   ev.operands if ev else [], p.dtype, rep.replay, rep.weights["nonfinite"] if rep.weights else [],
                   call.module in set(main_blocks(p.model)), p.labels[call.input_index], failed, len(p.batches),
                   cfg["diagnosis"])
    rep.diagnosis = diagnose(evd)
    if len(p.batches) > 1 and failed:
        rep.notes.append(f"{len(failed)} of {len(p.batches)} inputs produced non-finite values: "
                         + ", ".join(f"#{i} {p.labels[i]}" for i in failed[:10]))
