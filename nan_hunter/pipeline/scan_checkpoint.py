"""The scan pipeline: load → weights scan → model + inputs → capture → locate → replay →
diagnose → report. The CLI and ``nan_hunter.scan`` both call ``scan`` here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import Config, as_config
from ..errors import BadInput
from ..explain import fix_check
from ..explain.diagnose import Evidence, diagnose
from ..load.checkpoint import open_checkpoint
from ..load.weights import WeightsScan, scan_weights
from ..model.prepare import Prepared, parse_dtype, prepare
from ..report import Report
from .progress import stage

if TYPE_CHECKING:  # pragma: no cover
    from ..dtypes import RunDtype


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
                               f"module output — {ev.outcome or 'the result is finite but silently wrong'}"})
    return out


def run_block(p: Prepared, failed: list[int]) -> dict[str, Any]:
    return {"dtype": p.dtype, "compute_dtype": p.run.compute, "device": str(p.device), "n_inputs": len(p.batches),
            "failed_inputs": failed, "inputs": p.labels, "generate": None}


def scan(checkpoint: str, arch: str | None = None, inputs: list[str] | None = None,
         prompts: list[str] | None = None, data: str | None = None, dtype: str | None = None,
         device: str = "auto", stats: str = "fast", config: str | Config | None = None, attn: str | None = None,
         progress: Callable[[str, int], None] | None = None, replay: bool = True,
         compile: str | None = None, rtol: float = 1e-2, generate: int | None = None,
         batch: bool = False, device_map: str | None = None, max_memory: list[str] | None = None,
         backward: bool = False, loss: str | None = None) -> Report:
    """``compile``: a torch.compile backend; the run is then compared with its compiled form
    (``compiled.compare_compiled``, tolerance ``rtol``). ``generate``: greedy decoding of up to
    that many new tokens per input, captured step by step (``batch``: all inputs decoded together,
    left-padded). ``device_map="auto"`` (``max_memory``: ``["cpu=200MB", ...]``): the model is
    placed by accelerate across GPUs, CPU memory and disk (``placement``), instead of ``device``.
    ``backward``: forward then backward of the model's own loss (HF causal LMs) or of ``loss``
    (``file.py:fn``, ``fn(outputs, batch) -> scalar``), captured (``backward_scan``). A capsule
    directory (``DIR/step-<k>``) is rebuilt and re-run (``capsule_replay``)."""
    from ..model.placement import parse as parse_placement

    cfg = as_config(config)
    from ..load.capsule import is_capsule

    if is_capsule(checkpoint):  # DIR/step-<k> written by watch(capsule_dir=...): rebuild and re-run that step
        from ..modes.capsule_step import scan_capsule

        return scan_capsule(checkpoint, weights_block, arch=arch, device=device, stats=stats, config=cfg, progress=progress,
                            replay=replay, inputs=inputs, prompts=prompts, data=data, dtype=dtype,
                            generate=generate, compile=compile, backward=backward, loss=loss, device_map=device_map)
    parse_dtype(dtype)
    if loss is not None and not backward:
        raise BadInput("--loss is the loss --backward differentiates: add --backward")
    if backward and (generate is not None or compile is not None):
        raise BadInput(f"--backward cannot be combined with {'--generate' if generate is not None else '--compile'}; "
                       "run them separately")
    placement = parse_placement(device_map, max_memory)
    if placement is not None and compile is not None:
        raise BadInput("--compile with --device-map auto is not supported: torch.compile does not trace "
                       "accelerate's offload hooks; drop one of them")
    if generate is not None and (isinstance(generate, bool) or not isinstance(generate, int) or generate < 1):
        raise BadInput(f"--generate {generate!r}: give the number of new tokens to decode, e.g. --generate 16")
    if batch and generate is None:
        raise BadInput("--batch decodes the inputs together: it needs --generate N")
    if compile is not None:
        from ..modes.compiled import check_options

        check_options(compile, rtol, dtype)
    ck = open_checkpoint(checkpoint)
    if stats not in ("fast", "full"):
        raise BadInput(f"--stats {stats!r}: use fast or full")
    ws = scan_weights(ck, exact=stats == "full", progress=progress)
    rep = Report(checkpoint=ck.describe(), weights=weights_block(ws, cfg))
    with stage("load"):
        prepared = prepare(ck, arch, inputs, prompts, data, dtype, device, cfg, attn, placement=placement)
    if prepared is None or not prepared.batches:
        rep.notes.append("weights-only scan: no --arch and no config.json, so nothing was run"
                         if prepared is None else prepared.notes[0])
        if ws.nonfinite:
            rep.diagnosis = diagnose(Evidence(None, None, None, None, None, weights_nonfinite=rep.weights["nonfinite"],
                                              config=cfg.diagnosis))
        return rep
    rep.notes += prepared.notes
    if backward:  # forward then backward of a loss, captured (backward_scan)
        from ..modes.backward import run_backward

        run_backward(prepared, rep, loss, replay=replay)
    elif generate is not None:
        run_generation(prepared, rep, generate, batch, replay=replay)
    else:
        run_model(prepared, rep, replay=replay)
    if compile is not None:
        from ..modes.compiled import compare_compiled

        with stage("compile"):
            compare_compiled(prepared, rep, compile, rtol)
    rep.add_context(texts=prepared.texts)
    return rep


def run_model(p: Prepared, rep: Report, replay: bool = True) -> None:
    """Capture, locate, replay and diagnose one prepared run into ``rep``."""
    from ..distributed import rank_split

    if rank_split.splitting():  # under torchrun: each rank runs its share of the inputs
        return rank_split.run_model_split(p, rep, replay, explain=explain, near_misses=near_misses,
                                          run_block=run_block, failed_note=_failed_note)
    from ..locate.producer import call_table, failed_inputs, first_finding, mask_notes
    from ..model.execute import capture_run, forward

    cfg = p.cfg
    with stage("capture"):
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
    kw = p.batches[finding.call.input_index]
    explain(p, rep, finding, lambda: forward(p.model, kw, p.run), finding.call.input_index, failed, replay=replay)
    _failed_note(p, rep, failed)


def explain(p: Prepared, rep: Report, finding: Any, rerun: Callable[[], Any], input_index: int,
            failed: list[int], step: int = 0, replay: bool = True) -> tuple[Any, tuple, dict]:
    """Op location, replay and diagnosis of one finding into ``rep``: re-run (``rerun``, a forward
    of the whole model from copies of the failing forward's inputs) to the failing module, then
    that module alone. Returns (module, args, kwargs) of the failing call."""
    from ..capture.blocks import main_blocks
    from ..explain.replay import replay as do_replay
    from ..locate.first_op import locate_op
    from ..locate.mha_slow_path import through_slow_path
    from ..locate.producer import to_first_nonfinite
    from ..model.placement import materialized

    call = finding.call
    with materialized(p.model, call.module):  # --device-map: offloaded weights in place for the re-runs
        with stage("locate"):
            ev, target, margs, mkw = through_slow_path(locate_op(p.model, rerun, finding, p.run),
                                                       lambda: locate_op(p.model, rerun, finding, p.run), rep.notes)
        if replay and finding.role == "producer":
            with stage("replay"):
                rep.replay = do_replay(target, margs, mkw, p.run)
    rep.first_nonfinite = to_first_nonfinite(finding, ev, step=step)
    rep.first_nonfinite.input_index = input_index
    evd = Evidence(finding.role, rep.first_nonfinite.kind, call.module, call.module_type, ev.op if ev else None,
                   ev.operands if ev else [], p.run, rep.replay, rep.weights["nonfinite"] if rep.weights else [],
                   call.module in set(main_blocks(p.model)), p.labels[input_index], failed, len(p.batches),
                   p.cfg.diagnosis, op_absmax=ev.exact_absmax if ev else None)
    rep.diagnosis = diagnose(evd)
    whole = {"model": p.model, "batch": p.batches[input_index]} if step == 0 and finding.role == "producer" else {}
    with stage("fix"):
        fix_check.check(rep.diagnosis, fix_check.Region(call.module, target, margs, mkw), p.run, **whole)
    return target, margs, mkw


def _failed_note(p: Prepared, rep: Report, failed: list[int]) -> None:
    if len(p.batches) > 1 and failed:
        rep.notes.append(f"{len(failed)} of {len(p.batches)} inputs produced non-finite values: "
                         + ", ".join(f"#{i} {p.labels[i]}" for i in failed[:10]))


def run_generation(p: Prepared, rep: Report, max_new_tokens: int, batched: bool, replay: bool = True) -> None:
    """``--generate N``: greedy decoding under capture, stopped at the first non-finite step; the
    failing module of that step is located, replayed and diagnosed from the step's own inputs
    (the KV cache as it was), and the first row and token position holding the fault named."""
    import torch

    from ..locate.position import token_position
    from ..locate.producer import call_table, first_finding, mask_notes
    from ..model.execute import run_context
    from ..modes.generate import check_can_generate, decode, generate_block
    from ..tree import detached_copy

    check_can_generate(p.model)
    for i, b in enumerate(p.batches):
        ids = b.get("input_ids")
        if not (hasattr(ids, "dim") and ids.dim() == 2 and ids.shape[0] == 1):
            raise BadInput(f"--generate: input #{i} ({p.labels[i]}) has no single row of input_ids; decoding needs "
                           "token ids (--prompt, --data, or --inputs files holding input_ids of shape [1, T])")
    groups = [list(range(len(p.batches)))] if batched else [[i] for i in range(len(p.batches))]
    with stage("decode"):
        decoded = [decode(p, g, max_new_tokens, batched) for g in groups]
    failed: list[int] = []
    first = None
    for d in decoded:
        if d.first_bad_step is None:
            continue
        snap = d.watch.inputs_of(d.first_bad_step)
        d.failed_rows = _rows_holding_faults(p, snap) if batched else [0]
        failed += [d.indices[r] for r in d.failed_rows]
        first = first or d
    failed = sorted(set(failed))
    rep.run = run_block(p, failed)
    rep.run["generate"] = generate_block(decoded, max_new_tokens)
    rep.run["generate"]["per_input"] = _per_input(decoded, failed)
    if failed:
        rep.run["generate"]["shortest_failing_prefix"] = _shortest_prefixes(p, failed, max_new_tokens)
    rep.inputs = [{"index": i, "label": lbl, "finite": i not in failed} for i, lbl in enumerate(p.labels)]
    if first is None:
        last = decoded[-1].watch
        rows = last.sink.rows()
        rep.modules = _by_input(call_table(last.calls, rows), decoded[-1].indices[0])
        rep.notes += mask_notes(last.calls, rows)
        rep.near_misses = near_misses(rep.modules, p.run, p.cfg, [])
        return
    w, step = first.watch, first.first_bad_step
    rows = w.sink.rows()
    step_calls = [c for c in w.calls if c.input_index == step]
    finding = first_finding(step_calls, rows)
    rep.modules = _by_input(call_table(step_calls, rows), first.indices[0])
    rep.notes += mask_notes(step_calls, rows)
    snap = w.inputs_of(step)

    def rerun() -> Any:
        args, kwargs = snap.rerun()
        with torch.no_grad(), run_context(p.run):
            return p.model(*args, **kwargs)

    target, margs, mkw = explain(p, rep, finding, rerun, first.indices[0], failed, step=step, replay=replay)
    with torch.no_grad(), run_context(p.run):
        out = target(*detached_copy(margs), **detached_copy(mkw))
    row, pos = token_position(out, snap.kwargs)
    index = first.indices[min(row, len(first.indices) - 1)]
    rep.first_nonfinite.input_index = index
    rep.first_nonfinite.position = pos
    rep.run["generate"].update(_fault_text(p, first, index, step, pos))
    if batched and len(p.batches) > len(failed):
        rest = [i for i in range(len(p.batches)) if i not in failed]
        rep.notes.append(f"the batch stopped at step {step}: inputs {', '.join(f'#{i}' for i in rest)} were decoded "
                         f"only up to it; run without --batch to decode each of them to {max_new_tokens} tokens")
    _failed_note(p, rep, failed)


def _by_input(table: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """Module rows of a decoding: the recorder counts steps; the report names the data-set input."""
    for row in table:
        row["step"], row["input_index"] = row["input_index"], index
    return table


def _per_input(decoded: list[Any], failed: list[int]) -> list[dict[str, Any]]:
    """Per input, in data-set order: whether it failed and at which step (prompt sensitivity)."""
    rows = []
    for d in decoded:
        for i in d.indices:
            rows.append({"index": i, "failed": i in failed,
                         "step": d.first_bad_step if i in failed else None, "steps": d.steps})
    return sorted(rows, key=lambda r: r["index"])


def _shortest_prefixes(p: Prepared, failed: list[int], max_new_tokens: int) -> dict[str, int]:
    """For each failing input, the fewest prompt tokens whose greedy decoding still goes
    non-finite within ``max_new_tokens`` (the search of ``bisect --over inputs``)."""
    from dataclasses import replace

    from ..bisection.search import shortest_failing_prefix
    from ..modes.generate import decode

    out: dict[str, int] = {}
    for i in failed:
        kw = p.batches[i]
        length = int(kw["input_ids"].shape[-1])

        def fails(n: int, kw: dict = kw, length: int = length) -> bool:
            cut = {k: v[:, :n] if hasattr(v, "dim") and v.dim() == 2 and v.shape[1] == length else v
                   for k, v in kw.items()}
            one = replace(p, batches=[cut], labels=["prefix"])
            return decode(one, [0], max_new_tokens, batched=False).first_bad_step is not None

        n = shortest_failing_prefix(length, fails)
        if n is not None:
            out[str(i)] = n
    return out


def _fault_text(p: Prepared, d: Any, index: int, step: int, position: int | None) -> dict[str, Any]:
    """The token the failing step read and the text generated before it, for the terminal view."""
    row = d.indices.index(index)
    ids = p.batches[index]["input_ids"][0].tolist() + d.new_tokens[row]
    token = ids[position] if position is not None and 0 <= position < len(ids) else None
    tok = p.tokenizer

    def text(x: list[int]) -> str | None:
        return tok.decode(x) if tok is not None else None

    return {"fault_token": None if token is None else {"id": token, "text": text([token])},
            "text_before_fault": text(d.new_tokens[row])}


def _rows_holding_faults(p: Prepared, snap: Any) -> list[int]:
    """Batch rows with a NaN/±inf in any module output of a re-run of the failing step."""
    import torch

    from ..model.execute import run_context
    from ..tree import float_tensors

    args, kwargs = snap.rerun()
    ids = kwargs.get("input_ids")
    n = int(ids.shape[0]) if ids is not None else 1
    bad = [False] * n

    def hook(mod: Any, a: Any, out: Any) -> None:
        for _, t in float_tensors(out):
            if t.dim() >= 1 and t.shape[0] == n:
                rows = (~torch.isfinite(t.detach())).reshape(n, -1).any(dim=1).tolist()
                for r, b in enumerate(rows):
                    bad[r] = bad[r] or b

    handles = [m.register_forward_hook(hook) for m in p.model.modules()]
    try:
        with torch.no_grad(), run_context(p.run):
            p.model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return [r for r, b in enumerate(bad) if b] or [0]
