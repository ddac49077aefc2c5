"""Diagnosis rules: evidence (op, operands, dtype limits, replay matrix) → cause, numbers, fix.

Each rule is a function registered with ``@rule``; the first that matches wins, in registry
order (most specific first). A rule returns None when it does not apply. Thresholds come from
the ``diagnosis`` section of the config; dtype limits from the run's ``RunDtype`` (an fp8 run's
activations are bounded by its compute dtype, not by the fp8 max).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import DiagnosisConfig, default_config
from ..dtypes import Limits, RunDtype, canonical, limits
from ..load.quant.base import is_fault
from ..report import Diagnosis, ReplayRow
from .facts import MECHANISM_WORDS, Subject, cause_of, subject_of, why_unknown

SOFTMAX_OPS = {"_softmax", "softmax", "_log_softmax", "log_softmax", "logsumexp", "_safe_softmax"}
DIV_OPS = {"div", "reciprocal", "true_divide", "divide", "rsqrt", "remainder", "fmod"}
DOMAIN_OPS = {
    "log",
    "log2",
    "log10",
    "log1p",
    "sqrt",
    "rsqrt",
    "pow",
    "acos",
    "asin",
    "atanh",
    "acosh",
    "xlogy",
    "lgamma",
    "digamma",
    "erfinv",
}
MATMUL_OPS = {
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "matmul",
    "linear",
    "_scaled_mm",
    "addbmm",
    "einsum",
    "convolution",
    "_convolution",
    "dot",
    "mv",
}
CAST_OPS = {"_to_copy", "to", "copy", "copy_", "_autocast_to_reduced_precision", "convert_element_type"}


@dataclass(kw_only=True)
class Evidence:
    """What the rules read; built by ``assemble.diagnosis_of`` (keyword-only: no positional mix-ups)."""

    role: str | None  # producer | weights | input | None (weights-only scan)
    kind: str | None
    module: str | None
    module_type: str | None
    op: str | None  # "aten.addmm.default"
    operands: list[Any] = field(default_factory=list)  # ops.OperandStats
    dtype: RunDtype | str | None = None  # the run's precision (a name is read with the default fp8 recipe)
    replay: dict[str, ReplayRow] | None = None
    weights_nonfinite: list[dict[str, Any]] = field(default_factory=list)
    is_block: bool = False
    input_label: str | None = None
    failed_inputs: list[int] = field(default_factory=list)
    n_inputs: int = 0
    config: DiagnosisConfig | None = None
    compile: dict[str, Any] | None = None  # scan --compile: eager and compiled parted (modes/compiled.py)
    op_absmax: float | None = None  # |result| of the op re-run on its operands in float64 (ops.OpEvent)
    phase: str = "forward"  # forward | backward | optimizer (training faults)
    grad_fn: str | None = None  # backward: the autograd node that ran the op
    optimizer: dict[str, Any] | None = None  # optimizer faults: locate.training_phases.optimizer_facts
    bad_scales: list[dict[str, Any]] = field(
        default_factory=list
    )  # weights.quantized entries with a faulty block
    mechanism: str | None = None  # contract v1.4: the located op's IEEE mechanism (capture.mechanism)
    op_dtype: str | None = (
        None  # the dtype the located op computed in (under autocast not every op is lowered)
    )
    run: RunDtype | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.dtype, RunDtype):
            self.run, self.dtype = self.dtype, self.dtype.name
        elif self.dtype is not None:
            self.run = RunDtype.of(self.dtype)
            self.dtype = self.run.name
        # the op's own dtype is what the rules reason from: CPU autocast leaves div/std in fp32 under a
        # bf16 run (an fp8 run's ops compute in its compute dtype, which its RunDtype already knows)
        if self.op_dtype is not None and self.run is not None and not self.run.is_fp8:
            try:
                own = canonical(self.op_dtype)
            except (KeyError, ValueError):
                own = None
            if own is not None and own != self.run.compute and own in ("fp16", "bf16", "fp32", "fp64"):
                self.run = RunDtype.of(own)
                self.dtype = self.run.name
        if self.config is None:
            self.config = default_config().diagnosis

    @property
    def subject(self) -> Subject | None:
        """What in the model it happened to (``facts.subject_of``)."""
        return subject_of(
            role=self.role,
            phase=self.phase,
            module=self.module,
            module_type=self.module_type,
            op=self.op,
            is_block=self.is_block,
        )

    @property
    def run_name(self) -> str | None:
        """The run's dtype name: what ``dtype`` holds after ``__post_init__`` (never a ``RunDtype`` then)."""
        return self.run.name if self.run is not None else None

    @property
    def thresholds(self) -> DiagnosisConfig:
        """``config``, which ``__post_init__`` sets to the default config's when none is given."""
        return self.config if self.config is not None else default_config().diagnosis

    @property
    def range(self) -> Limits | None:
        """Limits of what the run stores activations in (the one dtype rule)."""
        return self.run.range if self.run is not None else None

    @property
    def opname(self) -> str:
        """Bare op name: ``aten.addmm.default`` → ``addmm``."""
        if not self.op:
            return ""
        parts = self.op.split(".")
        return parts[1] if len(parts) >= 2 else parts[0]

    @property
    def where(self) -> str:
        m = self.module if self.module else "<root>"
        return f"{self.op} in {m}" if self.op else m

    def finite_in(self) -> list[str]:
        return [d for d, r in (self.replay or {}).items() if r.get("finite") and d != "fp64"]

    def nonfinite_in(self) -> list[str]:
        return [d for d, r in (self.replay or {}).items() if not r.get("finite") and d != "fp64"]

    def true_absmax(self) -> float | None:
        """Magnitude the op's result really has: the op re-run on its operands in float64. The
        replay's absmax is the *module output's* (after softmax, a norm or a projection), never
        the op's, so it is only used when there is no op (weights, data)."""
        if self.op_absmax is not None:
            return self.op_absmax
        if self.op:
            return None
        for d in ("fp64", "fp32"):
            r = (self.replay or {}).get(d)
            if r and r.get("finite") and r.get("absmax") is not None:
                absmax: float = r["absmax"]
                return absmax
        return None

    def tensor_operands(self) -> list[Any]:
        return [o for o in self.operands if o.dtype != "scalar"]

    def is_attention(self) -> bool:
        name = f"{self.module or ''} {self.module_type or ''}".lower()
        return any(k in name for k in ("attn", "attention", "score", "qk"))

    def is_fp8_run(self) -> bool:
        return self.run is not None and self.run.is_fp8


Rule = Callable[[Evidence], Diagnosis | None]
RULES: list[tuple[str, Rule]] = []


def rule(name: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        RULES.append((name, fn))
        return fn

    return deco


def _g(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"


def _matrix_line(ev: Evidence) -> str | None:
    if not ev.replay:
        return None
    ok, bad = ev.finite_in(), ev.nonfinite_in()
    parts = []
    if ok:
        parts.append("finite in " + ", ".join(ok))
    if bad:
        parts.append("non-finite in " + ", ".join(bad))
    return "replay: " + "; ".join(parts) if parts else None


def _inaccurate_line(ev: Evidence) -> str | None:
    """Replay dtypes that stayed finite but are off from float64 by more than ``rel_err_warn``."""
    warn = ev.thresholds.rel_err_warn
    off = [
        (d, r["rel_err"])
        for d, r in (ev.replay or {}).items()
        if d != "fp64" and r.get("finite") and r.get("rel_err") is not None and r["rel_err"] > warn
    ]
    if not off:
        return None
    limit = f"{warn:.0%}" if warn >= 0.01 else f"{warn:g}"
    return (
        "replay: finite but inaccurate in "
        + ", ".join(f"{d} (rel_err {e:.3g})" for d, e in off)
        + f" — more than {limit} off the float64 result"
    )


def _diag(ev: Evidence, cause: str, summary: str, evidence: Sequence[str | None], fix: str) -> Diagnosis:
    lines = [e for e in evidence if e]
    for extra in (_matrix_line(ev), _inaccurate_line(ev)):
        if extra and extra not in lines:
            lines.append(extra)
    return Diagnosis(cause, ev.run_name, ev.module, ev.op, summary, lines, fix)


#: optimizer state the update divides by (the square root of): Adam/AdamW/Adamax/NAdam/RAdam, RMSprop, Adagrad
DENOMINATOR_STATE = {"exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum", "exp_inf"}


@rule("optimizer_step")
def optimizer_step(ev: Evidence) -> Diagnosis | None:
    """An optimizer step that made a parameter non-finite; the mechanism from what the step divided
    by (``_optimizer_step``) when no op was re-run: a zero denominator gives 0/0 (NaN) or x/0 (±inf)."""
    d = _optimizer_step(ev)
    if d is not None and d.mechanism is None and ev.mechanism is None:
        if d.cause == "division_by_zero":
            d.mechanism = "0/0" if ev.kind == "nan" else "x/0"
        elif d.cause == "overflow":
            d.mechanism = "overflow"
    return d


def _optimizer_step(ev: Evidence) -> Diagnosis | None:
    o = ev.optimizer
    if ev.phase != "optimizer" or not o:
        return None
    name, dt, opt = o.get("param"), o.get("dtype"), o.get("optimizer")
    lines = [
        f"{name} ({dt}) was finite, with a finite gradient, before {opt}.step() and holds "
        f"{o.get('nonfinite')} non-finite value(s) of {o.get('numel')} after it"
    ]
    hp = o.get("hyperparameters", {})
    if "lr" in hp:
        lines.append(
            "hyperparameters: "
            + ", ".join(f"{k}={hp[k]}" for k in ("lr", "eps", "betas", "weight_decay") if k in hp)
        )
    zero_state = {
        k: v for k, v in o.get("state", {}).items() if isinstance(v, dict) and v.get("zeros_where_nonfinite")
    }
    denominators = {k: v for k, v in zero_state.items() if k in DENOMINATOR_STATE}
    zero_state = denominators or zero_state
    for k, v in o.get("state", {}).items():
        if isinstance(v, dict):
            lines.append(
                f"state {k} ({v['dtype']}): {v['zeros_where_nonfinite']} zero(s) where the parameter went "
                f"non-finite, {v['zeros']} in all"
            )
    if o.get("grad_zeros_where_nonfinite") is not None:
        lines.append(
            f"gradient: {o['grad_zeros_where_nonfinite']} zero(s) where the parameter went non-finite, "
            f"absmax {_g(o.get('grad_absmax'))}"
        )
    eps, held = o.get("eps"), o.get("eps_in_dtype")
    fix_master = (
        "Keep fp32 master weights and optimizer state (train with fp32 parameters under torch.autocast, "
        "or an optimizer with fp32 state), "
    )
    if eps and held == 0 and zero_state:
        lines.insert(
            1,
            f"eps {eps:g} rounds to 0 in {dt}: where {', '.join(zero_state)} is 0 the update "
            f"divides by sqrt(0) + 0 = 0",
        )
        return Diagnosis(
            "division_by_zero",
            dt,
            ev.module,
            ev.op,
            f"{opt}'s eps {eps:g} rounds to zero in {dt}: the step divided by zero in {name}",
            lines,
            fix_master + f"or use an eps {dt} can hold (e.g. eps=1e-4 for fp16); a lower lr does not "
            "help a division by zero.",
        )
    if zero_state:
        return Diagnosis(
            "division_by_zero",
            dt,
            ev.module,
            ev.op,
            f"{opt}.step() divided by a zero optimizer state in {name}",
            lines,
            fix_master + "or raise eps so that sqrt(state) + eps stays above zero in " + f"{dt}.",
        )
    if ev.kind in ("posinf", "neginf"):
        return Diagnosis(
            "overflow",
            dt,
            ev.module,
            ev.op,
            f"{opt}.step() overflowed {dt} in {name}",
            lines,
            fix_master + "lower the learning rate, or clip gradients (clip_grad_norm_) before the step.",
        )
    return Diagnosis(
        "unknown",
        dt,
        ev.module,
        ev.op,
        f"{opt}.step() made {name} non-finite; no rule explains it",
        lines,
        fix_master + "and check the learning-rate schedule.",
    )


@rule("backward_incoming")
def backward_incoming(ev: Evidence) -> Diagnosis | None:
    if ev.phase != "backward" or ev.role != "input":
        return None
    which = ev.input_label or "from the loss"
    return _diag(
        ev,
        "nonfinite_input",
        f"the gradient reaching the model's outputs ({which}) was already "
        f"{ev.kind}: the loss or its scaling made it, not the model",
        [f"first module whose backward received it: {ev.module or '<root>'} ({ev.module_type})"],
        "Check the loss: compute it in fp32 (cross_entropy on logits.float()), guard log/div inside it with "
        "an eps, and with GradScaler let the scaler skip the step (scaler.step/update) rather than call "
        "optimizer.step() directly.",
    )


def _scale_faults(q: dict[str, Any]) -> list[dict[str, Any]]:
    """The bad blocks of a ``weights.quantized`` entry that are faults, zero points apart."""

    return [b for b in q["bad_blocks"] if is_fault(q, b) and b["problem"] != "zero_point"]


def _block_words(q: dict[str, Any], b: dict[str, Any]) -> str:
    """Where a bad block is, in the format's own terms."""
    fmt, idx = q["format"], b["index"]
    if b.get("tensor"):
        return f"element {idx} of {b['tensor']}" if idx else f"{b['tensor']}"
    if not idx:
        return f"the global scale of {q['name']}"
    if fmt in ("gptq", "awq"):
        return f"group {idx} of {q['scale']}"
    if fmt.startswith("gguf:"):
        return f"block {idx} ([row, block]) of {q['name']}" + (
            f" ({b['field']})" if b.get("field") else " (d)"
        )
    unit = (
        "absmax block"
        if fmt in ("bnb_nf4", "bnb_fp4")
        else "row (SCB)"
        if fmt == "bnb_int8"
        else "element"
        if fmt == "scale"
        else "block"
    )
    return f"{unit} {idx} of {q['scale']}"


#: what to do about a bad scale, by format family
_SCALE_FIX = {
    "gguf": "Re-convert the model (convert_hf_to_gguf.py, then llama-quantize) from the unquantized weights, or "
    "re-download the file.",
    "bnb": "bitsandbytes quantizes when the model is loaded: load the unquantized checkpoint with "
    "BitsAndBytesConfig again (or re-download the shard holding the absmax/SCB tensors).",
    "scale": "Re-run the calibration that produced the activation/KV scales (or set the bad ones to 1.0 and "
    "accept the range error), then re-export.",
}


@rule("bad_scale")
def bad_scale(ev: Evidence) -> Diagnosis | None:
    """A quantized weight whose scale is NaN/Inf, or zero on a block holding data; an activation/KV/global
    scale that is NaN, Inf, zero or negative (weights scan)."""
    qs = [q for q in ev.bad_scales if _scale_faults(q)]
    if not qs or ev.role not in (None, "weights"):
        return None
    lines = []
    for q in qs[:5]:
        bad = _scale_faults(q)
        lines.append(
            f"{q['name']} ({q['format']}): {_block_words(q, bad[0])} is {bad[0]['scale']} "
            f"({bad[0]['problem']}); {q.get('n_bad', len(bad))} of {q['n_blocks']} blocks bad"
        )
    if len(qs) > 5:
        lines.append(f"... and {len(qs) - 5} more quantized weights")
    q = qs[0]
    b = _scale_faults(q)[0]
    what = {"nan": "NaN", "inf": "Inf", "zero": "zero on a block holding data", "negative": "negative"}[
        b["problem"]
    ]
    if q["format"] == "scale":
        what = {"zero": "zero", "negative": "negative"}.get(b["problem"], what)
        became = "every value it scales is lost (NaN, Inf or 0)"
    else:
        became = f"its dequantized values are {'0' if b['problem'] == 'zero' else 'NaN/Inf'}"
    family = (
        "gguf"
        if q["format"].startswith("gguf:")
        else "bnb"
        if q["format"].startswith("bnb_")
        else q["format"]
    )
    if b["problem"] == "zero" and q["format"] != "scale":
        fix = (
            "A calibration or quantizer divided by a zero absmax: re-quantize that group with an eps on the scale "
            "(scale = max(amax / qmax, 1e-12), as torchao clamps it) from the unquantized checkpoint. "
        )
    else:
        fix = (
            "The quantization scales are corrupt (a bad shard, or a calibration that saw an empty or non-finite "
            "block). "
        )
    fix += _SCALE_FIX.get(
        family,
        "Re-run the quantization from the unquantized checkpoint, or re-download the "
        "shard holding the scale tensor.",
    )
    return _diag(
        ev,
        "bad_scale",
        f"quantized weight {q['name']} has a {what} scale at {_block_words(q, b)}: {became}",
        lines,
        fix,
    )


@rule("bad_zero_point")
def bad_zero_point(ev: Evidence) -> Diagnosis | None:
    """A symmetric GPTQ checkpoint whose zero points follow the other ``checkpoint_format`` convention:
    every weight is dequantized one scale step off (weights scan)."""
    qs = [q for q in ev.bad_scales if any(b["problem"] == "zero_point" for b in q["bad_blocks"])]
    if not qs or ev.role not in (None, "weights"):
        return None
    q = qs[0]
    b = next(b for b in q["bad_blocks"] if b["problem"] == "zero_point")
    declared, found = b.get("declared"), b.get("found")
    stores = {"gptq": "zero - 1 (v1)", "gptq_v2": "zero (v2)"}
    how = (
        f"its zero points follow {found!r} (stored {b.get('zero_point')}, {stores.get(found, '?')})"
        if found
        else f"its zero points are neither convention (group {b['index']} stores {b.get('zero_point')})"
    )
    lines = [
        f"{x['name']} ({x['format']}): {y.get('n_groups', '?')} of {x['n_blocks']} groups store a zero point "
        f"other than {y.get('expected')}, first group {y['index']} ({y.get('zero_point')})"
        for x in qs[:5]
        for y in x["bad_blocks"]
        if y["problem"] == "zero_point"
    ]
    if len(qs) > 5:
        lines.append(f"... and {len(qs) - 5} more quantized weights")
    lines.append(
        f"checkpoint_format {declared!r} declares: stored zero = {stores.get(declared, '?')}; "
        f"sym: true puts every zero at the midpoint"
    )
    fix = (
        f"Declare the convention the zeros follow: set quantization_config.checkpoint_format to {found!r} "
        f"in config.json (or re-export with gptqmodel as checkpoint_format={declared!r}, which rewrites the zeros)."
        if found
        else "Re-export the checkpoint with gptqmodel (the zero points are not one convention)."
    )
    return _diag(
        ev,
        "bad_zero_point",
        f"GPTQ weight {q['name']} is declared {declared!r} but {how}: every weight "
        "is dequantized one scale step off",
        lines,
        fix,
    )


@rule("uninitialised_read")
def uninitialised_read(ev: Evidence) -> Diagnosis | None:
    """The fault follows the fill of fresh allocations (``capture.fresh_fill``: NaN-filled re-run
    non-finite, zero-filled finite): the op read memory nobody wrote, whatever its arithmetic."""
    if ev.role != "producer" or ev.mechanism != "uninitialised_read":
        return None
    d = _diag(
        ev,
        "uninitialised_read",
        f"uninitialised_read: {ev.where} read memory that was never written",
        [
            "the failing module re-run with its fresh allocations (torch.empty, empty_like, new_empty, "
            "empty_strided) filled with NaN was non-finite, filled with zeros finite: the result depends on "
            "memory nothing wrote"
        ],
        MECHANISM_FIX["uninitialised_read"],
    )
    d.mechanism = "uninitialised_read"
    return d


@rule("nonfinite_weights")
def nonfinite_weights(ev: Evidence) -> Diagnosis | None:
    if ev.role != "weights" and not (ev.role is None and ev.weights_nonfinite):
        return None
    ws = ev.weights_nonfinite
    lines = [
        f"{w['name']} ({w['dtype']} {w['shape']}{', ' + w['file'] if w.get('file') else ''}): {w['nan']} NaN, "
        f"{w['posinf']} +inf, {w['neginf']} −inf, first at {w['first_index']}"
        for w in ws[:5]
    ]
    if len(ws) > 5:
        lines.append(f"... and {len(ws) - 5} more tensors")
    where = (
        f"first used by {ev.module or '<root>'} ({ev.module_type})"
        if ev.module is not None
        else "found by the weights scan"
    )
    if not ws and ev.module is not None:  # under watch(): no checkpoint, the live parameters
        held = f" ({ev.input_label})" if ev.input_label else ""
        return _diag(
            ev,
            "nonfinite_weights",
            f"parameters or buffers of {ev.module or '<root>'}{held} already hold {ev.kind} when it runs",
            [],
            "The weights were non-finite before this forward: look for the step that made them so (watch "
            "with backward=True and optimizer= names the backward or optimizer step), or restore them "
            "from a checkpoint.",
        )
    return _diag(
        ev,
        "nonfinite_weights",
        f"the checkpoint itself holds NaN/Inf in {len(ws)} tensor(s); {where}",
        lines,
        "The checkpoint is corrupt or was saved after training diverged: restore an earlier checkpoint "
        "or re-export it; check the training run for the step where the loss went NaN.",
    )


@rule("nonfinite_input")
def nonfinite_input(ev: Evidence) -> Diagnosis | None:
    if ev.role != "input":
        return None
    which = f"input {ev.input_label}" if ev.input_label else "the input data"
    return _diag(
        ev,
        "nonfinite_input",
        f"{which} already holds {ev.kind} before any module ran",
        [
            f"first module that received it: {ev.module or '<root>'} ({ev.module_type})",
            f"failing inputs: {ev.failed_inputs} of {ev.n_inputs}" if ev.n_inputs > 1 else None,
        ],
        "The input data is bad, not the model: fix the data pipeline — check preprocessing for NaN/Inf (e.g. torch.isfinite on the batch) "
        "and drop or repair bad samples before the forward.",
    )


@rule("masked_softmax")
def masked_softmax(ev: Evidence) -> Diagnosis | None:
    op = ev.opname
    ops = ev.tensor_operands()
    lines = []
    if op in SOFTMAX_OPS and any(o.neginf for o in ops) and ev.kind == "nan":
        o = next(o for o in ops if o.neginf)
        lines.append(
            f"{ev.op} input holds {o.neginf} −inf of {o.numel} values: at least one row is entirely −inf, "
            "and softmax of a fully masked row is exp(−inf − (−inf)) = NaN"
        )
    elif (
        op in {"sub", "add"} and ev.kind == "nan" and sum(1 for o in ev.operands if o.neginf or o.posinf) >= 2
    ):
        lines.append(f"{ev.op}: −inf − (−inf) (or inf + −inf) = NaN")
    elif op in {"add", "sub"} and ev.kind == "neginf" and ev.range is not None:
        lim = ev.range
        mins = [o.min for o in ops if o.min is not None]
        if len(mins) >= 2 and sum(1 for m in mins if m <= -0.5 * lim.max) >= 2:
            lines.append(
                f"{ev.op}: two mask planes near finfo({ev.dtype}).min = −{lim.max:.6g} added together "
                f"overflow to −inf; a fully masked row then makes softmax NaN"
            )
    if not lines:
        return None
    return _diag(
        ev,
        "masked_softmax",
        f"softmax over a fully masked row at {ev.where}",
        lines,
        "Use a safe softmax (or PyTorch SDPA, which has one since 2.5), or build masks as booleans and apply "
        "them with torch.where / masked_fill — never add two finfo.min planes; make sure no row is fully "
        "masked (e.g. left-padding with no valid key).",
    )


@rule("scale_underflow")
def scale_underflow(ev: Evidence) -> Diagnosis | None:
    if ev.opname not in DIV_OPS or ev.kind not in ("posinf", "neginf"):
        return None
    tiny = ev.thresholds.tiny_scale
    divisor = ev.operands[-1] if ev.operands else None
    if ev.opname == "reciprocal" and ev.operands:
        divisor = ev.operands[0]
    if divisor is None or divisor.zeros or divisor.min_nonzero is None or divisor.min_nonzero >= tiny:
        return None
    lim = ev.range.max if ev.range is not None else None
    lines = [
        f"divisor {_g(divisor.min_nonzero)} is tiny but non-zero; {ev.opname} gives {ev.kind}"
        + (
            f" (1/{_g(divisor.min_nonzero)} = {_g(1 / divisor.min_nonzero)} > {ev.range.name} max {lim:.6g})"
            if lim and ev.range
            else ""
        ),
        "a later 0 · inf turns zeros into NaN (the fp16 → fp8 quantisation case)",
    ]
    return _diag(
        ev,
        "scale_underflow",
        f"a scale of {_g(divisor.min_nonzero)} overflowed when inverted at {ev.where}",
        lines,
        "Compute amax and the scale in fp32 (or fp64) and clamp amax with an eps before dividing, as "
        "torchao's float8 does: scale = finfo(f8).max / clamp(amax.double(), min=1e-12).",
    )


@rule("division_by_zero")
def division_by_zero(ev: Evidence) -> Diagnosis | None:
    if ev.opname not in DIV_OPS:
        return None
    divisor = (
        ev.operands[0] if ev.opname in {"reciprocal", "rsqrt"} else (ev.operands[-1] if ev.operands else None)
    )
    if divisor is None or not divisor.zeros:
        return None
    num = ev.operands[0] if len(ev.operands) > 1 else None
    what = "0/0" if (num is not None and num.zeros and ev.kind == "nan") else "x/0"
    lines = [f"{ev.op}: divisor has {divisor.zeros} zero(s) of {divisor.numel} → {what} = {ev.kind}"]
    if ev.dtype in ("fp32", "fp64"):
        # the op already computed in fp32 (under CPU autocast too): a wider dtype cannot help
        lines.append(
            f"{ev.opname} computed in {ev.dtype}: the divisor is exactly zero there, not rounded to zero"
        )
        fix = (
            "Guard the denominator: divide by (d + eps) or d.clamp_min(eps), or leave out the rows where it is "
            f"zero (an empty mask, every element ignored); the division ran in {ev.dtype}, so a wider dtype does "
            "not help."
        )
    else:
        fix = (
            f"Add an eps {ev.dtype or 'the dtype'} can hold (its smallest normal is "
            f"{limits(ev.dtype).smallest_normal:.2g}) or compute the norm/denominator in fp32."
            if ev.dtype
            else "Add an eps the dtype can hold or compute the norm/denominator in fp32."
        )
    if ev.dtype in ("fp16", "bf16") and "fp32" in ev.finite_in():
        lines.append(
            f"finite in fp32 but not in {ev.dtype}: an eps such as 1e-12 rounds to zero in {ev.dtype} "
            f"(smallest subnormal {limits(ev.dtype).smallest_subnormal:.3g})"
        )
        fix = (
            f"The eps rounds to zero in {ev.dtype}: use an eps the dtype can hold (≥ 6.1e-05 in fp16) or compute "
            "the norm in fp32 (x.float(), then cast back)."
        )
    return _diag(ev, "division_by_zero", f"division by zero at {ev.where}", lines, fix)


@rule("domain_error")
def domain_error(ev: Evidence) -> Diagnosis | None:
    op = ev.opname
    if op not in DOMAIN_OPS or not ev.operands:
        return None
    x = ev.operands[0]
    lines = []
    if op in {"log", "log2", "log10", "sqrt", "rsqrt", "pow", "lgamma"} and x.negatives:
        lines.append(f"{ev.op} of {x.negatives} negative value(s), min {_g(x.min)}")
    elif op in {"log", "log2", "log10"} and x.zeros:
        lines.append(f"{ev.op} of {x.zeros} zero(s) → −inf")
    elif op == "log1p" and x.min is not None and x.min <= -1:
        lines.append(f"log1p of values ≤ −1 (min {_g(x.min)})")
    elif op in {"acos", "asin", "atanh", "erfinv"} and x.absmax is not None and x.absmax > 1:
        lines.append(f"{ev.op} of values outside [−1, 1] (absmax {_g(x.absmax)})")
    elif op == "acosh" and x.min is not None and x.min < 1:
        lines.append(f"acosh of values < 1 (min {_g(x.min)})")
    if not lines:
        return None
    return _diag(
        ev,
        "domain_error",
        f"{op} outside its domain at {ev.where}",
        lines,
        f"Clamp the argument into {op}'s domain (e.g. x.clamp_min(eps) before log/sqrt) or fix the upstream "
        "sign error that made it negative.",
    )


def _holding_dtypes(ev: Evidence) -> list[str]:
    """The dtypes an overflow's fix may propose to run in: bf16 and fp32, never the one the run
    computed in; those in which the replayed failing region was finite, or, without a replay, those
    with a wider range than the run's (fp16 → bf16, fp32; none for a bf16 or fp32 run)."""
    ran = ev.run.compute if ev.run is not None else None
    if ev.replay:
        return [d for d in ("bf16", "fp32") if d != ran and d in ev.finite_in()]
    lim = ev.range.max if ev.range is not None else None
    return [d for d in ("bf16", "fp32") if d != ran and lim is not None and limits(d).max > 2 * lim]


def _no_dtype(ev: Evidence) -> str:
    """Why no dtype is proposed (``_holding_dtypes`` is empty)."""
    if ev.replay:
        return "the failing region overflows in every dtype it was replayed in"
    return f"no dtype has a wider range than {ev.range.name if ev.range is not None else 'the run dtype'}"


def _unfit_param(ev: Evidence) -> Any | None:
    """The largest operand that is one of the model's parameters (or buffers) and does not fit the
    dtype the op computed in: its absmax past ``param_fraction`` of the dtype's max (past the max
    itself, its cast to the dtype overflows)."""
    lim = ev.range.max if ev.range is not None else None
    if not lim:
        return None
    unfit = [
        o
        for o in ev.tensor_operands()
        if getattr(o, "param", None)
        and o.absmax is not None
        and o.absmax >= ev.thresholds.param_fraction * lim
    ]
    return max(unfit, key=lambda o: o.absmax, default=None)


def _param_overflow(ev: Evidence, rng: Limits, p: Any, lines: list[str], holds: list[str]) -> Diagnosis:
    """An overflow caused by a parameter that does not fit the run's dtype: named, with a fix that
    applies (a dtype the replay showed to hold it, never the one that failed); ``rng``: the run's range."""
    lim, dt = rng.max, rng.name
    a = p.absmax
    fit = (
        f"absmax {_g(a)} > {dt} max {lim:.6g}: it cannot be represented in {dt}"
        if a > lim
        else f"absmax {_g(a)} is {a / lim:.0%} of {dt} max {lim:.6g}: a product with anything ≥ {lim / a:.3g} overflows"
    )
    lines = [f"parameter {p.param} ({p.dtype}{list(p.shape)}): {fit}"] + lines
    if ev.opname in CAST_OPS:
        summary = f"the cast of parameter {p.param} (absmax {_g(a)}) to {dt} overflowed at {ev.where}"
    else:
        summary = (
            f"parameter {p.param} (absmax {_g(a)}) does not fit {dt}: {ev.opname or 'an op'} over it "
            f"overflowed at {ev.where}"
        )
    module = ev.module or "this module"
    ways = []
    if "bf16" in holds:
        ways.append("run in bf16, which has fp32's range (under torch.autocast: dtype=torch.bfloat16)")
    if "fp32" in holds:
        ways.append(
            f"keep {module} in fp32 (under torch.autocast: autocast disabled around it; else the policy "
            "`nanhunter bisect` writes)"
        )
    why = (
        f"{p.param} grew to {_g(a)}: find out why (a learning rate too high, a diverging update, a bad load "
        "or an in-place write), restore it from a checkpoint, and clip gradients or lower the learning rate so "
        "it does not grow again."
    )
    if ways:
        fix = (
            ways[0][0].upper()
            + ways[0][1:]
            + "".join(f", or {w}" for w in ways[1:])
            + "; and "
            + why[0].lower()
            + why[1:]
        )
    else:
        fix = f"No dtype fixes it ({_no_dtype(ev)}): " + why[0].lower() + why[1:]
    d = _diag(ev, "overflow", summary, lines, fix)
    d.param = p.param
    return d


@rule("overflow")
def overflow(ev: Evidence) -> Diagnosis | None:
    if ev.kind not in ("posinf", "neginf") or ev.role != "producer":
        return None
    if any(not o.finite for o in ev.operands):
        return None
    run = ev.dtype or "the run dtype"
    dt = ev.dtype if ev.dtype and ev.dtype != "fp32" else None
    lim = ev.range.max if ev.range is not None else None
    holds = _holding_dtypes(ev)
    true = ev.true_absmax()
    if true is not None and lim and ev.range:
        head = f"absmax {_g(true)} > {ev.range.name} max {lim:.6g} at {ev.where}"
        if ev.op_absmax is not None:
            head += " (the op re-run in float64 from its operands)"
    else:
        head = f"result of {ev.where} exceeds the largest finite {run} value"
    # which dtypes stay finite is the replay line's to say (_matrix_line), once
    operand_line = "operands, all finite: " + ", ".join(
        f"#{o.index} {o.dtype}{list(o.shape)} absmax {_g(o.absmax)}" for o in ev.tensor_operands()[:3]
    )
    lines = [head, operand_line]
    unfit = _unfit_param(ev)
    if unfit is not None and ev.range is not None:  # an unfit parameter is one past the range's max
        return _param_overflow(ev, ev.range, unfit, lines, holds)
    # dtypes are proposed only where they help: never the run's own, never one the replay saw fail
    run_in = " or ".join(holds)
    keep = "fp32" in holds
    if ev.is_fp8_run():
        fix = (
            "In fp8, check the scaling recipe: scale by amax (rowwise for activations with outliers), compute "
            "amax/scale in fp32 and clamp amax with an eps; keep this module in bf16 if needed (`nanhunter bisect`)."
        )
        what = "fp8"
    elif ev.subject == Subject.ATTENTION_SCORES and ev.opname in MATMUL_OPS:
        fix = (
            "Attention scores overflow: "
            + (f"run in {run_in}, " if run_in else "")
            + "use fused SDPA / flash attention (it scales before the matmul)"
            + (", or upcast q and k to fp32 for the q·kᵀ scores" if keep else "")
            + (f"; {_no_dtype(ev)}: rescale q and k." if not holds else ".")
        )
        what = "attention scores"
    elif ev.subject == Subject.RESIDUAL:
        fix = (
            "The residual stream passed the dtype's max: "
            + (f"run in {run_in}; " if run_in else "")
            + "clamp or rescale activations (e.g. clamp to finfo.max − 1000 as T5 does)"
            + (" or keep the residual in fp32." if keep else ".")
        )
        what = "residual stream"
    elif ev.opname in CAST_OPS:
        fix = (
            f"A value past {ev.range.name if ev.range else run}'s max was cast down to it: "
            + (f"run in {run_in}, or " if run_in else "")
            + "rescale the values before the cast."
        )
        what = f"cast to {ev.range.name if ev.range else run}"
    elif ev.opname in MATMUL_OPS or "linear" in (ev.module_type or "").lower():
        ways = (
            [
                f"keep {ev.module or 'this module'} in fp32 with the modules it needs (`nanhunter bisect --dtype "
                f"{dt or 'fp16'}` finds the smallest such set)"
            ]
            if keep
            else []
        )
        ways += ["run in bf16"] if "bf16" in holds else []
        fix = (
            ", or ".join(ways) + "."
            if ways
            else f"No dtype holds the result ({_no_dtype(ev)}): rescale the values that feed it."
        )
        fix = fix[0].upper() + fix[1:]
        what = "matmul"
    else:
        fix = (
            (
                f"Run in {run_in}"
                + (
                    f", or keep {ev.module or 'this module'} in fp32 (`nanhunter bisect` finds "
                    "the smallest set)"
                    if keep
                    else ""
                )
                + "; rescale the values that feed it."
            )
            if holds
            else f"Rescale the values that feed it ({_no_dtype(ev)})."
        )
        what = ev.opname or "op"
    return _diag(ev, "overflow", f"{what} overflow in {run} at {ev.where}", lines, fix)


@rule("compile_divergence")
def compile_divergence(ev: Evidence) -> Diagnosis | None:
    c = ev.compile
    if not c or not c.get("eager_finite"):
        return None
    where = ev.module or "<root>"
    how = (
        f"non-finite ({ev.kind})"
        if not c["compiled_finite"]
        else f"{_g(c['max_rel_err'])} apart (max_rel_err > rtol {c['rtol']:g})"
    )
    lines = [
        f"input #{c['input_index']} ({c['input_label']}): eager finite, torch.compile ({c['backend']}) {how}",
        f"{where} ({ev.module_type}) compiled alone on eager's inputs parts from eager "
        + ("(non-finite)" if not c["module_compiled_finite"] else f"(rel_err {_g(c['module_rel_err'])})"),
    ]
    if c["children_alike"]:
        lines.append(
            f"its children {', '.join(c['children_alike'])} match eager when compiled alone: the "
            "difference comes from fusing across them (an intermediate kept in higher precision)"
        )
    emu = c.get("emulate_precision_casts")
    closes = bool(emu and emu["compiled_finite"] and emu["max_rel_err"] <= c["rtol"])
    if emu:
        lines.append(
            f"re-run with torch._inductor.config.emulate_precision_casts = True: compiled "
            f"{'finite' if emu['compiled_finite'] else 'non-finite'}, max_rel_err {_g(emu['max_rel_err'])}"
            f" — {'closes' if closes else 'does not close'} the gap"
        )
    if closes:
        fix = (
            "Set torch._inductor.config.emulate_precision_casts = True (or TORCHINDUCTOR_EMULATE_PRECISION_CASTS=1)"
            ": inductor then rounds intermediates to their dtype as eager does, and the compiled run matches."
        )
    else:
        fix = (
            f"Keep the numerics of {where} stable under fusion: compute its sensitive part (norm, amax, scale) in "
            "fp32 explicitly, add an eps or clamp where a tiny difference can become 0 or inf, or leave it out "
            "of the compiled graph (torch.compiler.disable)."
        )
    return _diag(ev, "compile_divergence", f"torch.compile parts from eager at {where}", lines, fix)


#: what to do, by the cause a mechanism makes (the rules above give their own, more specific fixes)
MECHANISM_FIX = {
    "overflow": "Run in a dtype with a wider range (bf16 or fp32) or rescale the values that feed it.",
    "division_by_zero": "Guard the denominator: divide by (d + eps) or d.clamp_min(eps), or leave out the rows "
    "where it is zero.",
    "domain_error": "Clamp the argument into the op's domain (x.clamp_min(eps) before log/sqrt) or fix the upstream "
    "value that left it.",
    "invalid_operation": "An infinity made earlier met a zero (0 × ∞) or another infinity (∞ − ∞, ∞/∞): find where "
    "the infinity was made (log(0), x/0, an overflow) and guard that op; masking the result "
    "afterwards does not remove the NaN from the gradient.",
    "empty_reduction": "A mean over no elements: make sure something is left to reduce (a loss whose every target "
    "is ignore_index, a fully masked batch, a variance of one element) — skip the batch, or use "
    "reduction='sum' divided by max(count, 1).",
    "masked_softmax": "A softmax over a row that is entirely −inf: make sure no row is fully masked, or use a safe "
    "softmax (SDPA's) that gives zeros there.",
    "nonfinite_input": "The op received a non-finite operand from upstream: find where it was made.",
    "uninitialised_read": "Write every element before it is read: allocate with torch.zeros (or new_zeros) instead "
    "of torch.empty, or mask the rows that are padding before they reach a sum, a matmul or "
    "an attention; a stale cache block must be cleared or masked when it is reused.",
    "nonfinite_weights": "The op read non-finite weights: restore them from a checkpoint.",
}


@rule("mechanism")
def mechanism(ev: Evidence) -> Diagnosis | None:
    """A located op that no rule above explains, explained by its IEEE mechanism: the cause
    follows from mechanism and subject (``facts.cause_of``)."""
    if ev.role != "producer" or ev.mechanism is None:
        return None
    cause = cause_of(ev.mechanism, ev.subject, ev.role).value
    what = MECHANISM_WORDS.get(ev.mechanism, ev.mechanism)
    subj = f" ({ev.subject.value.replace('_', ' ')})" if ev.subject is not None else ""
    ops = ", ".join(
        f"#{o.index} {o.dtype}{list(o.shape)} absmax {_g(o.absmax)}, {o.zeros} zero(s), "
        f"{o.nan + o.posinf + o.neginf} non-finite"
        for o in ev.tensor_operands()[:3]
    )
    return _diag(
        ev,
        cause,
        f"{ev.mechanism}: {what} at {ev.where}{subj}",
        [
            f"the op re-run in float64 at the first non-finite element: {ev.mechanism} ({what})",
            f"operands: {ops}" if ops else None,
        ],
        MECHANISM_FIX.get(cause, "Guard the op's operands."),
    )


@rule("unknown")
def unknown(ev: Evidence) -> Diagnosis | None:
    if ev.role is None and not ev.weights_nonfinite:
        return None
    ops = ", ".join(f"{o.dtype}{o.shape} absmax {_g(o.absmax)}" for o in ev.tensor_operands()[:3])
    return _diag(
        ev,
        "unknown",
        f"{ev.kind} first appears at {ev.where}; no rule explains it",
        [f"operands: {ops}" if ops else None, why_unknown(ev.op) if ev.op else None],
        "Inspect the op's operands (see the replay matrix); try bf16/fp32 or keep this module in fp32 "
        "(`nanhunter bisect`).",
    )


BACKWARD_FIX = {
    "division_by_zero": "The gradient divides by zero (the derivative of sqrt, rsqrt, x**p or a norm at 0 is "
    "infinite): put the eps inside, sqrt(x + eps) or (x.pow(2).sum() + eps).sqrt(), not sqrt(x) + "
    "eps; gradient clipping does not help a NaN.",
    "domain_error": "The gradient of this op is undefined at these values: clamp its input into the domain in the "
    "forward (the clamp also bounds the derivative); gradient clipping does not help a NaN.",
    "overflow": "The gradient overflowed the dtype: use loss scaling with a dynamic GradScaler (it backs off on "
    "overflow), compute gradients in bf16 instead of fp16, or keep this module in fp32 (`nanhunter "
    "bisect --backward`); clipping comes too late once a gradient is inf.",
}


def _facts(ev: Evidence, d: Diagnosis) -> Diagnosis:
    """The typed facts on ``d`` (contract v1.4): mechanism (a non-finite operand for weights and
    data), subject; cause ``unknown`` only where the mechanism is null."""
    if d.mechanism is None:
        arrived = ev.role in ("weights", "input") or d.cause in ("nonfinite_weights", "nonfinite_input")
        d.mechanism = "nonfinite_operand" if arrived else ev.mechanism
    if d.subject is None:
        subj = Subject.SCALE if d.cause == "scale_underflow" else ev.subject
        d.subject = subj.value if subj is not None else None
    if d.cause == "unknown" and d.mechanism is not None:
        d.cause = cause_of(d.mechanism, d.subject, ev.role).value
    return d


def diagnose(ev: Evidence) -> Diagnosis | None:
    for _, fn in RULES:
        d = fn(ev)
        if d is not None:
            _facts(ev, d)
            if ev.phase == "backward" and ev.role == "producer":
                node = f" ({ev.grad_fn})" if ev.grad_fn else ""
                d.summary = f"backward{node}: {d.summary}"
                d.fix = BACKWARD_FIX.get(d.cause, d.fix + " Gradient clipping does not help a NaN.")
            return d
    return None


def not_reproducible(
    module: str | None,
    op: str | None,
    dtype: str | None,
    kind: str | None,
    device: str,
    rank: int | None,
    original: Diagnosis | None = None,
) -> Diagnosis:
    """Cause ``not_reproducible``: the failing region, re-run from its captured inputs and weights
    on the same device, dtype and autocast, was finite. Names the device and, under
    torch.distributed, the rank; the fix says how to confirm a hardware fault."""
    where = f"{op} in {module or '<root>'}" if op else (module or "<root>")
    on = f"device {device}" + (f", rank {rank}" if rank is not None else "")
    evidence = [
        f"the first non-finite value ({kind or 'non-finite'}) appeared at {where} during the run",
        f"the same region re-run from the captured inputs and weights on {on} ({dtype or 'its dtype'}) "
        "was finite",
    ]
    if original is not None and original.cause not in ("unknown", "not_reproducible"):
        evidence.append(f"what the captured values alone suggest: {original.cause} ({original.summary})")
    return Diagnosis(
        cause="not_reproducible",
        dtype=dtype,
        module=module,
        op=op,
        summary=(
            f"{where} produced a non-finite value that did not come back when re-run on {on}: a transient "
            "hardware fault (a flipped bit, a failing GPU) or a non-deterministic kernel is suspected, "
            "not the numerics of the model"
        ),
        evidence=evidence,
        fix=(
            f"confirm it: re-run the failing step (its capsule: nanhunter scan DIR/step-<k>) on another device "
            f"than {on}; check the device's ECC error counters (nvidia-smi -q -d ECC) and its logs (Xid errors); "
            "with torch.use_deterministic_algorithms(True) a non-deterministic kernel is ruled out; if it "
            "recurs on this device only, take it out of the pool"
        ),
    )
