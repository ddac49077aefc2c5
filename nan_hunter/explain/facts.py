"""The typed facts of a diagnosis (contract v1.4): a cause code, the IEEE mechanism and the
subject. Code chooses fixes from these fields, never from the summary a person reads.

- ``Cause``: the report's cause codes (v1 and later; new ones are added, never renamed).
- ``Subject``: what in the model the fault happened to, from the located module, its type, the
  op and the phase (``subject_of``).
- ``cause_of(mechanism, subject, role)``: the cause that follows from mechanism and subject, for
  a located fault no more specific rule explained. ``unknown`` only when the mechanism is null.

Imports no torch: the terminal view and weights-only reports read it.
"""

from __future__ import annotations

from enum import StrEnum


class Cause(StrEnum):
    """Cause codes of ``diagnosis.cause``."""

    NONFINITE_WEIGHTS = "nonfinite_weights"
    NONFINITE_INPUT = "nonfinite_input"
    OVERFLOW = "overflow"
    SCALE_UNDERFLOW = "scale_underflow"
    DIVISION_BY_ZERO = "division_by_zero"
    DOMAIN_ERROR = "domain_error"
    MASKED_SOFTMAX = "masked_softmax"
    EMPTY_REDUCTION = (
        "empty_reduction"  # v1.4: a mean over nothing (every loss target ignored), var with correction ≥ n
    )
    INVALID_OPERATION = "invalid_operation"  # v1.4: 0 × ∞, ∞ − ∞ or ∞/∞ on an infinity made earlier
    UNINITIALISED_READ = "uninitialised_read"
    COMPILE_DIVERGENCE = "compile_divergence"
    BAD_SCALE = "bad_scale"
    BAD_ZERO_POINT = "bad_zero_point"
    NOT_REPRODUCIBLE = "not_reproducible"
    UNKNOWN = "unknown"


class Subject(StrEnum):
    """What in the model the fault happened to (``diagnosis.subject``)."""

    ATTENTION_SCORES = "attention_scores"
    ATTENTION_SOFTMAX = "attention_softmax"
    RESIDUAL = "residual"
    NORM = "norm"
    MLP = "mlp"
    EMBEDDING = "embedding"
    LOSS = "loss"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"
    WEIGHT = "weight"
    SCALE = "scale"
    CAST = "cast"
    ACTIVATION = "activation"


#: mechanism (``capture.mechanism.Mechanism`` values) → the cause it makes
MECHANISM_CAUSE = {
    "overflow": Cause.OVERFLOW,
    "x/0": Cause.DIVISION_BY_ZERO,
    "0/0": Cause.DIVISION_BY_ZERO,
    "inf/inf": Cause.INVALID_OPERATION,
    "0*inf": Cause.INVALID_OPERATION,
    "inf-inf": Cause.INVALID_OPERATION,
    "log(0)": Cause.DOMAIN_ERROR,
    "domain": Cause.DOMAIN_ERROR,
    "empty_reduction": Cause.EMPTY_REDUCTION,
    "all_masked_row": Cause.MASKED_SOFTMAX,
    "uninitialised_read": Cause.UNINITIALISED_READ,
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
    "dot",
    "mv",
}
SOFTMAX_OPS = {"_softmax", "softmax", "_log_softmax", "log_softmax", "logsumexp", "_safe_softmax"}
NORM_OPS = {
    "native_layer_norm",
    "layer_norm",
    "_fused_rms_norm",
    "rms_norm",
    "native_group_norm",
    "group_norm",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional",
    "rsqrt",
}
LOSS_OPS = {
    "nll_loss_forward",
    "nll_loss",
    "nll_loss2d_forward",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "mse_loss",
    "kl_div",
    "smooth_l1_loss",
    "huber_loss",
    "soft_margin_loss",
    "cross_entropy_loss",
}
CAST_OPS = {"_to_copy", "to", "copy", "copy_", "_autocast_to_reduced_precision", "convert_element_type"}
SCALE_OPS = {"reciprocal"}


def _has(text: str, *words: str) -> bool:
    return any(w in text for w in words)


def subject_of(
    *,
    role: str | None,
    phase: str = "forward",
    module: str | None = None,
    module_type: str | None = None,
    op: str | None = None,
    is_block: bool = False,
) -> Subject | None:
    """What the fault happened to: from the phase (gradient, optimizer state), the role (weights),
    the op (a loss, a cast, a softmax, a norm) and the module's name and type (attention, MLP,
    embedding, the residual add of a block). None when nothing says (a weights-only scan)."""
    if phase == "optimizer":
        return Subject.OPTIMIZER_STATE
    if role == "weights":
        return Subject.WEIGHT
    if phase == "backward" and role == "producer":
        return Subject.GRADIENT
    name = f"{module or ''} {module_type or ''}".lower()
    opname = (op or "").split(".")[1] if (op or "").startswith("aten.") else (op or "")
    if role == "input" or role is None and not op:
        return Subject.EMBEDDING if _has(name, "embed") else None
    if opname in LOSS_OPS or _has(name, "loss", "criterion"):
        return Subject.LOSS
    if opname in CAST_OPS:
        return Subject.CAST
    attention = _has(name, "attn", "attention", "score", "qk")
    if attention and opname in SOFTMAX_OPS:
        return Subject.ATTENTION_SOFTMAX
    if attention and opname in MATMUL_OPS:
        return Subject.ATTENTION_SCORES
    if opname in {"add", "add_", "sub"} and (is_block or _has((module_type or "").lower(), "layer", "block")):
        return Subject.RESIDUAL
    if opname in NORM_OPS or _has(name, "norm"):
        return Subject.NORM
    if _has(name, "embed"):
        return Subject.EMBEDDING
    if attention:
        return Subject.ATTENTION_SCORES if opname in {"add", "div", "mul"} else Subject.ACTIVATION
    if _has(name, "mlp", "ffn", "feed_forward", "feedforward", "fc", "dense", "proj", "wo", "wi"):
        return Subject.MLP
    if opname in SCALE_OPS:
        return Subject.SCALE
    return Subject.ACTIVATION


def cause_of(mechanism: str | None, subject: str | None = None, role: str | None = None) -> Cause:
    """The cause that follows from the mechanism and subject: a non-finite operand is the data's
    (``nonfinite_input``) or the weights' (``nonfinite_weights``) by role; −∞ − (−∞) in an
    attention softmax is a fully masked row. ``unknown`` only when the mechanism is null."""
    if mechanism is None:
        return Cause.UNKNOWN
    if mechanism == "nonfinite_operand":
        return Cause.NONFINITE_WEIGHTS if role == "weights" else Cause.NONFINITE_INPUT
    if mechanism == "inf-inf" and subject == Subject.ATTENTION_SOFTMAX:
        return Cause.MASKED_SOFTMAX
    return MECHANISM_CAUSE.get(mechanism, Cause.UNKNOWN)


#: a sentence per mechanism, for summaries and evidence
MECHANISM_WORDS = {
    "overflow": "a result past the dtype's largest finite value",
    "x/0": "a non-zero value divided by zero",
    "0/0": "zero divided by zero",
    "inf/inf": "infinity divided by infinity",
    "0*inf": "zero times infinity",
    "inf-inf": "infinity minus infinity",
    "log(0)": "the logarithm of zero",
    "domain": "a function outside its domain (log/sqrt of a negative, acos beyond 1)",
    "empty_reduction": "a mean or variance over no elements (every element ignored or masked, or correction ≥ n)",
    "all_masked_row": "a softmax over a row that is entirely −inf",
    "nonfinite_operand": "an operand that was already non-finite",
    "uninitialised_read": "a read of memory that was never written",
}


def why_unknown(op: str | None) -> str:
    """The evidence line for a located op whose mechanism could not be evaluated."""
    return (
        f"the mechanism of {op or 'the op'} could not be evaluated: it has no float64 or float32 kernel, "
        "reads an operand nanhunter cannot (a tensor subclass, a custom kernel), or its semantics are not "
        "known to nanhunter"
    )
