"""``nanhunter check``: the CI smoke check. Per checkpoint: the weights scan, then one forward in
each requested dtype when a model and inputs are available; policy rules (``configs/ci.yaml``)
turn the numbers into pass/warn/fail results stored in ``Report.check``.

Rules (ids are JUnit testcase names and never change meaning):
``weights.nonfinite``, ``weights.headroom.<dtype>``, ``forward.<dtype>.nonfinite``,
``forward.<dtype>.headroom``; and those of ``checkpoint_rules`` (``weights.quantized``,
``weights.suspicious``, ``weights.unchecked``, ``headroom_regression.<dtype>``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import Config, Thresholds, as_config
from ..dtypes import RunDtype, parse_dtype
from ..errors import BadInput
from ..explain.weights_verdict import weights_section, weights_verdict
from ..load.checkpoint import Checkpoint, open_checkpoint
from ..load.weights import scan_weights
from ..load.weights_sections import bad_scales
from ..model.inputs import one_or_many
from ..model.prepare import builds_a_model, prepare
from ..report import Report, write_json
from .checkpoint_rules import baseline_rules, weights_extra_rules
from .options import CheckOptions

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass
class RuleResult:
    rule: str
    checkpoint: str
    status: str  # pass | warn | fail
    message: str  # one line, with the numbers
    dtype: str | None = None
    value: float | None = None  # what was measured (a fraction of the dtype max, a count)
    details: list[str] = field(default_factory=list)  # evidence and fix, for failure bodies


# --- policy (configs/ci.yaml, validated by config.load_config) ----------------------------------


def parse_dtypes(spec: str | list[str] | None, cfg: Config) -> list[str]:
    """``--dtypes fp16,bf16`` (or the policy's ``dtypes:``) → canonical names, in order, deduplicated."""
    if spec is None:
        return list(cfg.check.dtypes)
    items = [s for s in (spec.split(",") if isinstance(spec, str) else [str(x) for x in spec]) if s.strip()]
    if not items:
        raise BadInput("--dtypes: no dtype given; use a comma-separated list such as fp16,bf16")
    out: list[str] = []
    for s in items:
        d = parse_dtype(s.strip(), "--dtypes")
        if d not in out:
            out.append(d)
    return out


def _range_max(dtype: str) -> float:
    """The largest finite value a run in ``dtype`` stores (the one dtype rule: for fp8 runs, the
    compute dtype's; fp8 operands are scaled by their amax)."""
    return RunDtype.of(dtype).range.max


def _grade(fraction: float, th: Thresholds) -> str:
    return FAIL if fraction > th.fail else WARN if fraction > th.warn else PASS


def _share(frac: float, dtype: str, mx: float) -> str:
    """ "is 92% of fp16 max 65504"; tiny fractions (bf16's 3.4e38) read as a headroom factor."""
    if frac == 0:
        return f"is 0 (any {dtype} holds it)"
    if frac < 1e-4:
        return f"is far below {dtype} max {mx:.3g} ({1 / frac:.2g}x headroom)"
    if frac >= 10:  # far past the max: a factor, not a percentage of 28 digits
        return f"is {frac:.3g}x {dtype} max {mx:.6g}"
    pct = f"{frac:.0%}" if frac >= 0.01 else f"{frac * 100:.2g}%"
    return f"is {pct} of {dtype} max {mx:.6g}"


# --- rules --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One weight as a run computes with it: a plain float tensor as stored, or a quantized weight as
    dequantized (its scale tensors, zero points and stored codes are never measured themselves)."""

    name: str
    absmax: float | None  # over finite values
    how: str = ""  # "" for a plain tensor; "dequantized <format>" for a quantized weight
    #: non-finite values the dequantization itself makes from finite scales (|code| x scale past float32):
    #: past every dtype's max
    overflow_all: bool = False


def measured(
    tensors: list[Any], quantized: Sequence[Any] = (), claimed: set[str] | frozenset = frozenset()
) -> list[Measured]:
    """What the headroom rules judge: every scanned float tensor no quantized format read (scales, zero
    points, quant states and codes are the format's, and judged dequantized), then every quantized weight
    by its dequantized values (``quant.base.QuantizedScan``)."""
    out = [
        Measured(t.name, t.absmax)
        for t in tensors
        if not t.skipped and t.absmax is not None and t.name not in claimed
    ]
    code_faults = {t.name for t in tensors if not t.skipped and not t.finite}
    for q in quantized:
        # non-finite values from a NaN/Inf scale are weights.quantized's; from NaN codes weights.nonfinite's;
        # any other non-finite value is an overflow of the dequantization itself
        made = not q.faulty and q.name not in code_faults and (q.dequant_nonfinite or q.nonfinite_blocks)
        if q.dequant_absmax is not None or made:
            out.append(Measured(q.name, q.dequant_absmax, f"dequantized {q.format}", bool(made)))
    return out


def weights_rules(
    ck_path: str,
    tensors: list[Any],
    dtypes: list[str],
    cfg: Config,
    quantized: Sequence[Any] = (),
    claimed: set[str] | frozenset = frozenset(),
) -> list[RuleResult]:
    """weights.nonfinite and weights.headroom.<dtype>, from a ``WeightsScan``'s tensors, quantized weights
    (``QuantizedScan``, judged dequantized) and the names the quantized formats read (``claimed``)."""
    out: list[RuleResult] = []
    # a NaN/Inf in a checked quantized weight's scale tensor is that weight's bad scale (weights.quantized)
    scales = {q.scale for q in quantized if q.faulty}
    bad = [t for t in tensors if not t.skipped and not t.finite and t.name not in scales]
    floating = [t for t in tensors if not t.skipped]
    if bad:
        status = FAIL if cfg.check.fail_on_nonfinite_weights else WARN
        first = ", ".join(
            f"{t.name}{_in_shard(t)} ({t.nan} NaN, {t.posinf} +inf, {t.neginf} −inf, first at "
            f"{t.first_index})"
            for t in bad[:3]
        )
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        out.append(
            RuleResult(
                "weights.nonfinite",
                ck_path,
                status,
                f"{len(bad)} of {len(floating)} floating tensors hold NaN/Inf: {first}{more}",
                value=float(len(bad)),
                details=[
                    "fix: the checkpoint itself is corrupt; re-export it from the last good "
                    "training step, or find the step where the loss went NaN"
                ],
            )
        )
    else:
        out.append(
            RuleResult(
                "weights.nonfinite",
                ck_path,
                PASS,
                f"no NaN/Inf in {len(floating)} floating tensors",
                value=0.0,
            )
        )
    sized = measured(tensors, quantized, claimed)
    for dt in dtypes:
        th = cfg.check.headroom.weights.get(dt)
        if th is None:
            continue
        rule = f"weights.headroom.{dt}"
        if not sized:
            out.append(RuleResult(rule, ck_path, PASS, "no floating-point tensors to measure", dt))
            continue
        mx = _range_max(dt)

        def frac_of(m: Measured, mx: float = mx) -> float:
            return math.inf if m.overflow_all else (m.absmax or 0.0) / mx

        top = max(sized, key=frac_of)
        frac = frac_of(top)
        n_warn = sum(1 for m in sized if frac_of(m) > th.warn)
        status = _grade(frac, th)
        what = f"{top.name} ({top.how})" if top.how else top.name
        if top.overflow_all:
            msg = f"{what} dequantizes to inf (|code| x scale past float32's max): no {dt} holds it"
        else:
            msg = (
                f"max |w| {top.absmax:.6g} in {what} {_share(frac, dt, mx)}; "
                f"warn above {th.warn:.0%}, fail above {th.fail:.0%}"
            )
            if frac > 1:
                msg += f"; it becomes inf when cast to {dt}"
        if n_warn > 1:
            msg += f"; {n_warn} tensors above {th.warn:.0%}"
        fix = (
            f"fix: {top.name}'s scales put its dequantized values past {dt}'s max: run it in bf16 (or fp32), "
            "or re-quantize it with smaller scales"
            if top.how
            else f"fix: keep {top.name}'s module in fp32 or bf16, or rescale it (fold the scale into the next layer)"
        )
        details = [] if status == PASS else [fix]
        out.append(RuleResult(rule, ck_path, status, msg, dt, frac if math.isfinite(frac) else None, details))
    return out


def _in_shard(t: Any) -> str:
    f = getattr(t, "file", None)
    return f" in {f}" if f else ""


def forward_rules(ck_path: str, dtype: str, run: Report, cfg: Config) -> list[RuleResult]:
    """forward.<dtype>.nonfinite and forward.<dtype>.headroom for one forward in ``dtype``."""
    out: list[RuleResult] = []
    n = run.run_fact("n_inputs", 0)
    failed = run.run_fact("failed_inputs") or []
    f = run.first_nonfinite
    rule = f"forward.{dtype}.nonfinite"
    if f is not None:
        status = FAIL if cfg.check.fail_on_nonfinite_forward else WARN
        cause = f" ({run.diagnosis.cause})" if run.diagnosis else ""
        msg = (
            f"{f.kind} first produced by {f.module or '<root>'} ({f.module_type}) at {f.op or '?'}{cause} "
            f"on input #{f.input_index}; {len(failed)} of {n} input(s) non-finite in {dtype}"
        )
        details = []
        if run.diagnosis:
            details = [run.diagnosis.summary, *run.diagnosis.evidence, f"fix: {run.diagnosis.fix}"]
        out.append(RuleResult(rule, ck_path, status, msg, dtype, float(len(failed)), details))
    else:
        absorbed = [m for m in run.near_misses if m.get("kind") == "absorbed"]
        if absorbed and cfg.check.warn_on_absorbed:
            out.append(
                RuleResult(
                    rule,
                    ck_path,
                    WARN,
                    f"outputs finite in {dtype} on {n} input(s), but {len(absorbed)} op(s) produced "
                    f"NaN/Inf that was absorbed: {absorbed[0]['message']}",
                    dtype,
                    0.0,
                    [m["message"] for m in absorbed],
                )
            )
        else:
            out.append(
                RuleResult(
                    rule, ck_path, PASS, f"all module outputs finite in {dtype} on {n} input(s)", dtype, 0.0
                )
            )
    th = cfg.check.headroom.activations.get(dtype)
    rows = [r for r in run.modules or [] if r.get("absmax") is not None]
    if th is not None and f is not None:
        # a forward that went non-finite has no headroom left, whatever its finite outputs show
        out.append(
            RuleResult(
                f"forward.{dtype}.headroom",
                ck_path,
                FAIL,
                f"no headroom: a value went {f.kind} in {dtype} at {f.module or '<root>'}",
                dtype,
                None,
                ["see forward." + dtype + ".nonfinite"],
            )
        )
    elif th is not None and rows:
        mx = _range_max(dtype)
        top = max(rows, key=lambda r: r["absmax"])
        frac = top["absmax"] / mx
        status = _grade(frac, th)
        msg = (
            f"max module output absmax {top['absmax']:.6g} at {top['module'] or '<root>'} "
            f"({top['module_type']}, input #{top['input_index']}) {_share(frac, dtype, mx)}; "
            f"warn above {th.warn:.0%}, fail above {th.fail:.0%}"
        )
        details = (
            []
            if status == PASS
            else [
                f"fix: {top['module'] or '<root>'} has less than {1 / frac:.2g}x headroom in {dtype}; keep it in fp32 "
                f"(`nanhunter bisect --dtype {dtype}`) or run in bf16"
            ]
        )
        out.append(RuleResult(f"forward.{dtype}.headroom", ck_path, status, msg, dtype, frac, details))
    return out


def run_summary(run: Report) -> dict[str, Any]:
    """One row of the dtype matrix: did the forward stay finite, where it broke, how close it came."""
    rows = [r for r in run.modules or [] if r.get("absmax") is not None]
    top = max(rows, key=lambda r: r["absmax"]) if rows else None
    f = run.first_nonfinite
    return {
        "finite": f is None,
        "failed_inputs": run.run_fact("failed_inputs") or [],
        "n_inputs": run.run_fact("n_inputs", 0),
        "first_nonfinite": asdict(f) if f else None,
        "cause": run.diagnosis.cause if run.diagnosis else None,
        "absmax": top["absmax"] if top else None,
        "absmax_module": top["module"] if top else None,
    }


# --- driver -------------------------------------------------------------------------------------


def forward_in(
    ck: Checkpoint, dtype: str, opts: CheckOptions, cfg: Config, weights: dict | None
) -> Report | str:
    """One captured forward in ``dtype`` (a Report), or why none could run (a note)."""

    p = prepare(
        ck,
        opts.arch,
        list(opts.inputs) or None,
        list(opts.prompts) or None,
        opts.data,
        dtype,
        opts.device,
        cfg,
        opts.attn,
    )
    if p is None:
        return "weights-only check: no --arch and no config.json, so no forward was run"
    if not p.batches:
        return p.notes[0]
    from ..modes.rank_split import run_mode_on_ranks  # lazy: torch
    from ..modes.registry import mode_for  # lazy: torch

    run = Report(checkpoint=ck.describe(), weights=weights, mode="check")
    run.notes += p.notes
    run_mode_on_ranks(p, mode_for(generate=opts.generate, batch=opts.batch), run, split=opts.split)
    run.add_context(texts=p.texts)  # inputs[i].text, as scan gives it
    if p.quantized is not None and run.run is not None:
        run.run["quantized"] = p.quantized
    return run


def check_checkpoint(
    ck: Checkpoint,
    label: str,
    dtypes: list[str],
    opts: CheckOptions,
    cfg: Config,
    progress: Callable[[str, int], None] | None = None,
    baseline: tuple[str, Any] | None = None,
) -> Report:
    """``baseline``: (path as given, its ``WeightsScan``) for ``--baseline OLD``."""

    ws = scan_weights(ck, exact=opts.stats == "full", progress=progress)
    weights = weights_section(ws, cfg)
    rep = Report(checkpoint=ck.describe(), weights=weights, mode="check")
    results = weights_rules(label, ws.tensors, dtypes, cfg, ws.quantized, ws.claimed)
    results += [RuleResult(**r) for r in weights_extra_rules(label, weights)]
    if baseline is not None:
        rules, rep.baseline = baseline_rules(label, ws.tensors, baseline[1].tensors, baseline[0], dtypes, cfg)
        results += [RuleResult(**r) for r in rules]
    runs: dict[str, Report] = {}
    for dt in dtypes:
        try:
            got = forward_in(ck, dt, opts, cfg, rep.weights)
        except BadInput as e:
            if not (ws.quantized or ws.quantized_unchecked):
                raise
            # a quantized model transformers cannot build here (GPTQ/AWQ without their kernel packages):
            # the weights verdict stands, with one line saying why nothing ran
            got = f"forward not run: {e}"
        if isinstance(got, str):  # no model or no inputs: the same for every dtype
            rep.notes.append(got)
            break
        method = got.run_fact("quantized")
        ran = got.run_fact("dtype", dt) if method else dt
        runs[ran] = got
        results += forward_rules(label, ran, got, cfg)
        if method:  # one forward: the quantized form is the same whatever dtype was asked
            rep.notes.append(
                f"the {method} model ran once, in its own quantized form ({ran}); --dtypes "
                f"{','.join(dtypes)} judge its weights"
            )
            break
    if runs:
        # The report's run/modules/diagnosis are those of the first failing forward, else the first.
        shown = next((d for d, r in runs.items() if r.first_nonfinite is not None), next(iter(runs)))
        r = runs[shown]
        rep.run, rep.modules, rep.inputs = r.run, r.modules, r.inputs
        rep.first_nonfinite, rep.replay, rep.diagnosis = r.first_nonfinite, r.replay, r.diagnosis
        rep.near_misses = r.near_misses
        rep.notes += r.notes
        if len(runs) > 1:
            others = ", ".join(
                f"{d}: {'finite' if x.first_nonfinite is None else 'NON-FINITE'}"
                for d, x in runs.items()
                if d != shown
            )
            rep.notes.append(f"run, modules and diagnosis below are from the {shown} forward ({others})")
    elif ws.nonfinite or bad_scales(ws):
        weights_verdict(rep, cfg, ws)
    rep.check = {
        "passed": not any(x.status == FAIL for x in results),
        "dtypes": dtypes,
        "results": [asdict(x) for x in results],
        "runs": {d: run_summary(r) for d, r in runs.items()},
    }
    return rep


def check(
    checkpoints: str | list[str],
    dtypes: str | list[str] | None = None,
    config: str | Config | None = None,
    progress: Callable[[str, int], None] | None = None,
    baseline: str | None = None,
    **options: Any,
) -> list[Report]:
    """Check each checkpoint (in order) against the CI policy; one Report per checkpoint.
    ``options`` are ``CheckOptions`` fields; ``baseline``: a previous checkpoint; each tensor
    present in both is compared (rule ``headroom_regression.<dtype>``).

    All checkpoints are opened first, so a bad path fails (exit 2) before anything runs.
    """

    checkpoints = list(one_or_many(checkpoints, "checkpoints"))  # a string is one checkpoint
    if not checkpoints:
        raise BadInput(
            "no checkpoint given: nanhunter check CHECKPOINT... (a .safetensors file or model directory)"
        )
    cfg = as_config(config)
    dts = parse_dtypes(dtypes, cfg)
    opts = CheckOptions(
        dtypes=tuple(dtypes) if isinstance(dtypes, list) else dtypes, baseline=baseline, **options
    )
    cks = [(path, open_checkpoint(path)) for path in checkpoints]
    if opts.has_inputs and not opts.arch:
        # refused before anything runs, naming the checkpoint: a mixed list (model directories and a bare
        # .safetensors file) with --prompt/--inputs/--data
        for path, ck in cks:
            if not builds_a_model(ck, None):
                given = "--prompt" if opts.prompts else "--inputs" if opts.inputs else "--data"
                raise BadInput(
                    f"{path}: cannot take {given}: no model can be built from it (no config.json; "
                    "pass --arch file.py:factory, or check it in a separate run without inputs)"
                )
    base = None
    if opts.baseline is not None:
        try:
            base = (opts.baseline, scan_weights(open_checkpoint(opts.baseline)))
        except BadInput as e:  # named as the baseline: the user gave two checkpoints
            raise BadInput(f"--baseline {opts.baseline}: {e}") from None
    return [check_checkpoint(ck, path, dts, opts, cfg, progress, base) for path, ck in cks]


def passed(reports: list[Report]) -> bool:
    return all((r.check or {}).get("passed") for r in reports)


def write_json_reports(reports: list[Report], path: str) -> None:
    """One checkpoint: its report v1 (as ``scan --json``). Several: a JSON array of reports v1,
    in the order the checkpoints were given."""

    write_json(reports[0] if len(reports) == 1 else reports, path)
