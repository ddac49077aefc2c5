"""The verdict line (contract v1.2 "Reports people can act on"): right for every cause code,
one line of at most 79 cells, in the first lines of the terminal output and again at the end."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from nan_hunter.render import rows as R
from nan_hunter.render.terminal import render
from nan_hunter.report import Diagnosis, FirstNonfinite, Report

LONG = "model.language_model.layers.17.self_attn.rotary_emb.inner_projection_with_a_long_name"


def _rep(
    cause: str,
    role: str = "producer",
    kind: str = "posinf",
    module: str = "ffn.wo",
    op: str | None = "aten.mm.default",
    **extra,
) -> Report:
    f = FirstNonfinite(input_index=0, module=module, module_type="Linear", op=op, kind=kind, role=role)
    d = Diagnosis(cause, "fp16", module, op, f"{cause} summary", [], "fix it")
    return Report(
        checkpoint={"path": "m.safetensors", "format": "safetensors", "n_tensors": 1, "bytes": 10},
        weights={"n_tensors": 1, "nonfinite": []},
        run={"dtype": "fp16", "device": "cpu", "n_inputs": 1, "failed_inputs": [0]},
        first_nonfinite=f,
        diagnosis=d,
        **extra,
    )


CASES = [
    ("overflow", {}, ["overflow:", "+inf first produced by ffn.wo", "aten.mm", "(fp16)"]),
    ("scale_underflow", {"op": "aten.reciprocal.default"}, ["scale_underflow:", "aten.reciprocal"]),
    (
        "division_by_zero",
        {"kind": "nan", "op": "aten.div.Tensor"},
        ["division_by_zero:", "NaN first produced"],
    ),
    ("domain_error", {"kind": "nan", "op": "aten.log.default"}, ["domain_error:", "aten.log"]),
    ("masked_softmax", {"kind": "nan", "op": "aten._softmax.default"}, ["masked_softmax:", "aten._softmax"]),
    ("unknown", {}, ["unknown:", "first produced by ffn.wo"]),
    (
        "nonfinite_input",
        {"role": "input", "kind": "nan", "op": None, "module": "proj"},
        ["nonfinite_input:", "NaN in the input data, first reaching proj (input #0)"],
    ),
    (
        "nonfinite_weights",
        {"role": "weights", "kind": "nan", "module": "decoder", "op": "aten.addmm.default"},
        ["nonfinite_weights:", "NaN in the weights of decoder"],
    ),
    (
        "compile_divergence",
        {"module": "norm", "compile": {"compiled_finite": False}},
        ["compile_divergence:", "torch.compile parts from eager at norm", ", non-finite"],
    ),
    (
        "not_reproducible",
        {"kind": "nan", "module": "layers.3.mlp"},
        ["not_reproducible:", "NaN at layers.3.mlp did not reproduce"],
    ),
    (
        "bad_scale",
        {"role": "weights", "kind": "nan", "module": "layers.0.mlp.down_proj", "op": None},
        ["bad_scale:", "layers.0.mlp.down_proj"],
    ),
    ("a_cause_added_later", {}, ["a_cause_added_later:", "ffn.wo"]),
]


@pytest.mark.parametrize("cause,kw,says", CASES, ids=[c[0] for c in CASES])
def test_verdict_names_the_cause_and_where(cause, kw, says):
    kw = dict(kw)
    extra = {"compile": kw.pop("compile")} if "compile" in kw else {}
    v = R.verdict(_rep(cause, **kw, **extra))
    assert v.tone == "bad" and v.text.startswith("✘ ")
    for s in says:
        assert s in v.text, (s, v.text)
    assert "?" not in v.text
    assert R.cells(v.text) <= 79


@pytest.mark.parametrize("cause,kw,says", CASES, ids=[c[0] for c in CASES])
def test_verdict_with_a_long_name_stays_on_one_line(cause, kw, says):
    kw = {**kw, "module": LONG}
    kw.pop("compile", None)
    v = R.verdict(_rep(cause, **kw))
    assert R.cells(v.text) <= 79 and v.text.startswith(f"✘ {cause}: ")
    assert "a_long_name" in v.text  # the tail of the name survives shortening


def test_weights_only_bad_scale_and_clean_runs():
    rep = Report(
        weights={"n_tensors": 2, "nonfinite": []},
        diagnosis=Diagnosis(
            "bad_scale",
            None,
            "model.layers.0.mlp.down_proj.weight_scale_inv",
            None,
            "a NaN scale in block [3, 1]",
            [],
            "re-export",
        ),
    )
    v = R.verdict(rep)
    assert v.text.startswith("✘ bad_scale: model.layers.0.mlp.down_proj.weight_scale_inv") and v.tone == "bad"
    clean = Report(weights={"n_tensors": 2, "nonfinite": [], "unchecked": [{"name": "a", "dtype": "F4"}]})
    assert (
        R.verdict(clean).text
        == "✔ no NaN/Inf found in the weights (weights-only scan) · 1 tensor not checked"
    )
    assert R.verdict(Report()).text == "✔ no NaN/Inf found in the weights (weights-only scan)"


def test_compile_divergence_without_any_nan_is_not_a_weights_count():
    """The old verdict said "0 tensor(s) with NaN/Inf in the checkpoint" after scan --compile."""
    rep = _rep("compile_divergence", module="norm")
    rep.weights = {"n_tensors": 3, "nonfinite": []}
    rep.first_nonfinite = None  # eager is finite: only the compiled run parts
    rep.compile = {"compiled_finite": True}
    assert (
        R.verdict(rep).text == "✘ compile_divergence: torch.compile parts from eager at norm, outputs differ"
    )


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_states_the_verdict_first_and_last(width):
    rep = _rep("overflow", module=LONG)
    buf = io.StringIO()
    render(rep, Console(file=buf, width=width, markup=False, emoji=False, highlight=False), strip=True)
    lines = buf.getvalue().splitlines()
    v = R.verdict(rep).text
    assert v in lines[:6] and lines[-1] == v
    assert all(R.cells(line) <= width for line in lines)
