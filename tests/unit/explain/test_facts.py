"""explain.facts: cause codes, subjects, and the cause that follows from mechanism and subject."""

from __future__ import annotations

import pytest

from nan_hunter.explain.facts import MECHANISM_CAUSE, Cause, Subject, cause_of, subject_of


@pytest.mark.parametrize(
    "mechanism, subject, role, cause",
    [
        ("overflow", "mlp", "producer", "overflow"),
        ("x/0", "norm", "producer", "division_by_zero"),
        ("0/0", "loss", "producer", "division_by_zero"),
        ("log(0)", "loss", "producer", "domain_error"),
        ("domain", "activation", "producer", "domain_error"),
        ("0*inf", "gradient", "producer", "invalid_operation"),
        ("inf-inf", "attention_softmax", "producer", "masked_softmax"),
        ("inf-inf", "residual", "producer", "invalid_operation"),
        ("empty_reduction", "loss", "producer", "empty_reduction"),
        ("all_masked_row", "attention_softmax", "producer", "masked_softmax"),
        ("nonfinite_operand", "weight", "weights", "nonfinite_weights"),
        ("nonfinite_operand", "embedding", "input", "nonfinite_input"),
        (None, "mlp", "producer", "unknown"),
    ],
)
def test_cause_follows_from_mechanism_and_subject(mechanism, subject, role, cause):
    assert cause_of(mechanism, subject, role) == Cause(cause)


def test_only_a_null_mechanism_is_unknown():
    assert all(c != Cause.UNKNOWN for c in MECHANISM_CAUSE.values())


@pytest.mark.parametrize(
    "kw, subject",
    [
        (
            {
                "role": "producer",
                "module": "model.layers.0.self_attn",
                "module_type": "LlamaAttention",
                "op": "aten.bmm.default",
            },
            Subject.ATTENTION_SCORES,
        ),
        (
            {
                "role": "producer",
                "module": "model.layers.0.self_attn",
                "module_type": "LlamaAttention",
                "op": "aten._softmax.default",
            },
            Subject.ATTENTION_SOFTMAX,
        ),
        (
            {
                "role": "producer",
                "module": "model.layers.0",
                "module_type": "LlamaDecoderLayer",
                "op": "aten.add.Tensor",
                "is_block": True,
            },
            Subject.RESIDUAL,
        ),
        (
            {
                "role": "producer",
                "module": "model.norm",
                "module_type": "LlamaRMSNorm",
                "op": "aten.mul.Tensor",
            },
            Subject.NORM,
        ),
        (
            {
                "role": "producer",
                "module": "model.layers.1.mlp.down_proj",
                "module_type": "Linear",
                "op": "aten.mm.default",
            },
            Subject.MLP,
        ),
        (
            {"role": "producer", "module": "", "module_type": "Net", "op": "aten.nll_loss_forward.default"},
            Subject.LOSS,
        ),
        (
            {
                "role": "producer",
                "module": "fc",
                "module_type": "Linear",
                "op": "aten.div.Tensor",
                "phase": "backward",
            },
            Subject.GRADIENT,
        ),
        ({"role": None, "phase": "optimizer"}, Subject.OPTIMIZER_STATE),
        ({"role": "weights", "module": "fc", "module_type": "Linear"}, Subject.WEIGHT),
        (
            {"role": "producer", "module": "q", "module_type": "Quant", "op": "aten._to_copy.default"},
            Subject.CAST,
        ),
    ],
)
def test_subject_from_module_op_and_phase(kw, subject):
    assert subject_of(**kw) == subject


def test_facts_import_no_torch():
    """The terminal view reads causes for weights-only reports: facts.py imports nothing but the stdlib."""
    import ast
    from pathlib import Path

    import nan_hunter.explain.facts as facts

    tree = ast.parse(Path(facts.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names <= {"__future__", "enum"}
