"""divergence/compare.py on hand-made traces: the entry that made the difference, not one that
passed it on; fused or extra ops on one side; tolerances; exit codes. (Pairing entries:
test_align.py.)"""

from __future__ import annotations

import pytest

from nan_hunter.divergence.compare import NotComparable, compare_traces
from nan_hunter.trace.reader import read_trace

from .synthetic import ENV, entry, write


def _diff(tmp_path, a, b, level="ops", **kw):
    ta = read_trace(write(tmp_path / "a.jsonl", a, level, **kw.pop("a_kw", {})))
    tb = read_trace(write(tmp_path / "b.jsonl", b, level, **kw.pop("b_kw", {})))
    return compare_traces(ta, tb, **kw)


def test_identical_traces_exit_0(tmp_path):
    e = [entry("m", "aten.mm.default", producers=[None]), entry("m", "aten.relu.default", producers=[0])]
    r = _diff(tmp_path, e, e)
    assert r.exit_code == 0 and r.first_divergence is None and r.compared == 2 and r.env_diff == []


def test_the_op_that_made_the_difference_not_the_one_that_passed_it_on(tmp_path):
    a = [
        entry("m", "aten.mm.default", producers=[None]),
        entry("m", "aten.exp.default", absmax=2.0, producers=[0]),
        entry("m", "aten.mul.Tensor", absmax=5.0, producers=[1]),
    ]
    b = [
        entry("m", "aten.mm.default", producers=[None]),
        entry("m", "aten.exp.default", absmax=2.5, producers=[0]),
        entry("m", "aten.mul.Tensor", absmax=6.0, producers=[1]),
    ]
    r = _diff(tmp_path, a, b)
    d = r.first_divergence
    assert r.exit_code == 1 and d.verdict.a.op == "aten.exp.default" and d.inputs_agree


def test_small_differences_amplified_name_the_amplifier(tmp_path):
    """mm differs within tolerance (5e-4 < 1e-3): its inputs agree for exp, which is named."""
    a = [
        entry("m", "aten.mm.default", absmax=1.0005, producers=[None]),
        entry("m", "aten.exp.default", absmax=3.0, producers=[0]),
    ]
    b = [
        entry("m", "aten.mm.default", producers=[None]),
        entry("m", "aten.exp.default", absmax=2.0, producers=[0]),
    ]
    assert _diff(tmp_path, a, b).first_divergence.verdict.a.op == "aten.exp.default"


def test_a_fused_op_on_one_side_does_not_derail_the_rest(tmp_path):
    """B computes rms_norm as one op where A decomposes it: the ops around still pair, and the
    divergence after them is found."""
    a = [
        entry("n", "aten.pow.Tensor_Scalar", producers=[None]),
        entry("n", "aten.mean.dim", producers=[0]),
        entry("n", "aten.rsqrt.default", producers=[1]),
        entry("n", "aten.mul.Tensor", producers=[None, 2]),
        entry("p", "aten.mm.default", producers=[3]),
        entry("p", "aten.add.Tensor", absmax=9.0, producers=[4]),
    ]
    b = [
        entry("n", "aten.mul.Tensor", producers=[None]),
        entry("p", "aten.mm.default", producers=[0]),
        entry("p", "aten.add.Tensor", absmax=7.0, producers=[1]),
    ]
    r = _diff(tmp_path, a, b)
    assert r.unmatched == (3, 0) and r.compared == 3
    assert r.first_divergence.verdict.a.op == "aten.add.Tensor" and r.first_divergence.inputs_agree


def test_module_level_inputs_by_their_recorded_statistics(tmp_path):
    """o_proj's input changed (attention's own ops made it), so attn is named, not o_proj."""
    same, other = {"absmax": 1.0, "mean": 0.0, "l2": 1.0}, {"absmax": 2.0, "mean": 0.0, "l2": 2.0}
    a = [
        entry("attn.q", inp=same),
        entry("attn.o", absmax=3.0, inp=other),
        entry("attn", absmax=3.0, inp=same),
    ]
    b = [
        entry("attn.q", inp=same),
        entry("attn.o", absmax=1.0, inp=same),
        entry("attn", absmax=1.0, inp=same),
    ]
    r = _diff(tmp_path, a, b, level="modules")
    assert r.first_divergence.verdict.a.module == "attn" and r.first_divergence.inputs_agree


def test_module_level_without_input_statistics_uses_the_preceding_entry(tmp_path):
    a = [entry("a"), entry("b", absmax=2.0), entry("c", absmax=3.0)]
    b = [entry("a"), entry("b", absmax=1.0), entry("c", absmax=1.0)]
    assert _diff(tmp_path, a, b, level="modules").first_divergence.verdict.a.module == "b"


def test_spread_widens_the_tolerance(tmp_path):
    a = [entry("m", "aten.mm.default", absmax=1.02, producers=[None], spread=0.01)]
    b = [entry("m", "aten.mm.default", producers=[None])]
    assert _diff(tmp_path, a, b).exit_code == 0  # 0.02 <= 4 x 0.01
    assert _diff(tmp_path, a, b, rtol=1e-3).exit_code == 0
    a[0]["spread"] = None
    assert _diff(tmp_path, a, b).exit_code == 1


def test_default_rtol_is_looser_for_half_precision(tmp_path):
    a = [entry("m", "aten.mm.default", absmax=1.005, producers=[None], dtype="bf16")]
    b = [entry("m", "aten.mm.default", producers=[None], dtype="bf16")]
    assert _diff(tmp_path, a, b).exit_code == 0
    a[0]["dtype"] = b[0]["dtype"] = "fp32"
    assert _diff(tmp_path, a, b).exit_code == 1


def test_one_side_non_finite_is_exit_1_and_named(tmp_path):
    a = [entry("m", "aten.div.Tensor", producers=[None])]
    b = [entry("m", "aten.div.Tensor", producers=[None], posinf=3, absmax=None, mean=None, l2=0.0)]
    r = _diff(tmp_path, a, b)
    assert r.exit_code == 1 and r.first_nonfinite_a is None and r.first_nonfinite_b.op == "aten.div.Tensor"
    d = r.to_dict()["first_divergence"]
    assert d["rel_err"] is None and d["classes_differ"] is True


def test_same_mask_on_both_sides_agrees(tmp_path):
    e = [entry("attn", "aten.masked_fill.Scalar", neginf=4, producers=[None])]
    r = _diff(tmp_path, e, e)
    assert r.exit_code == 0 and r.first_nonfinite_a.stats.kind == "neginf"


@pytest.mark.parametrize(
    "a_kw, b_kw, words",
    [
        (
            {"modules": ["a", "b"]},
            {"modules": ["a", "c"]},
            "different models: module names differ (only in A: 'b'; only in B: 'c')",
        ),
        ({"inputs_hash": "00000001"}, {"inputs_hash": "00000002"}, "different inputs: input #0"),
    ],
)
def test_not_comparable(tmp_path, a_kw, b_kw, words):
    e = [entry("a", "aten.mm.default", producers=[None])]
    with pytest.raises(NotComparable) as err:
        _diff(tmp_path, e, e, a_kw=a_kw, b_kw=b_kw)
    assert words in str(err.value)


def test_env_diff_lists_keys_that_differ(tmp_path):
    e = [entry("a", "aten.mm.default", producers=[None])]
    r = _diff(tmp_path, e, e, b_kw={"env": {**ENV, "threads": 1, "versions": {"torch": "2.14.1"}}})
    assert r.env_diff == [
        {"key": "versions.torch", "a": "2.13.0", "b": "2.14.1"},
        {"key": "threads", "a": 2, "b": 1},
    ]


def test_json_has_the_contract_keys(tmp_path):
    import json

    a = [entry("m", "aten.exp.default", absmax=2.0, producers=[None])]
    b = [entry("m", "aten.exp.default", absmax=3.0, producers=[None])]
    d = json.loads(json.dumps(_diff(tmp_path, a, b).to_dict()))
    assert d["schema"] == "nanhunter.diff/v1"
    for k in ("a", "b", "env_diff", "compared", "unmatched", "first_divergence", "first_nonfinite"):
        assert k in d
    assert set(d["a"]) >= {"path", "env"} and set(d["unmatched"]) == {"a", "b"}
    fd = d["first_divergence"]
    for k in (
        "module",
        "module_type",
        "op",
        "call_index",
        "input_index",
        "step",
        "source_file",
        "source_line",
        "a",
        "b",
        "rel_err",
        "tolerance",
        "inputs_agree",
    ):
        assert k in fd
    assert fd["rel_err"] == pytest.approx(1 / 3)


def test_python_api_takes_the_flags_names(tmp_path):
    import nan_hunter

    a = write(tmp_path / "a.jsonl", [entry("m", "aten.exp.default", absmax=2.0, producers=[None])])
    b = write(tmp_path / "b.jsonl", [entry("m", "aten.exp.default", absmax=2.001, producers=[None])])
    assert nan_hunter.diff(str(a), str(b)).exit_code == 0
    assert nan_hunter.diff(str(a), str(b), rtol=1e-4).exit_code == 1


def test_exact_cast_is_never_the_first_divergence(tmp_path):
    """fp16 against bf16: the embedding differs within the half-precision tolerance; its exact fp32
    upcast is judged at that tolerance too, and never blamed."""
    a = [
        entry(
            "emb",
            "aten.embedding.default",
            absmax=1.0,
            producers=[None, None],
            dtype="fp16",
            input_dtypes=["fp16"],
        ),
        entry("norm", "aten._to_copy.default", absmax=1.0, producers=[0], input_dtypes=["fp16"], output=True),
    ]
    b = [
        entry(
            "emb",
            "aten.embedding.default",
            absmax=1.005,
            producers=[None, None],
            dtype="bf16",
            input_dtypes=["bf16"],
        ),
        entry(
            "norm", "aten._to_copy.default", absmax=1.005, producers=[0], input_dtypes=["bf16"], output=True
        ),
    ]
    r = _diff(tmp_path, a, b)
    assert r.first_divergence is None and r.exit_code == 0
    assert r.outputs.equal == "within_tolerance" and r.outputs.tolerance == 1e-2


def test_an_fp32_op_on_an_upcast_bf16_value_is_judged_at_bf16s_tolerance(tmp_path):
    a = [
        entry("n", "aten.add.Tensor", producers=[None], dtype="bf16", input_dtypes=["bf16"]),
        entry("n", "aten._to_copy.default", producers=[0], input_dtypes=["bf16"]),
        entry("n", "aten.pow.Tensor_Scalar", absmax=1.005, producers=[1], input_dtypes=["fp32"], output=True),
    ]
    b = [
        entry("n", "aten.add.Tensor", producers=[None], dtype="bf16", input_dtypes=["bf16"]),
        entry("n", "aten._to_copy.default", producers=[0], input_dtypes=["bf16"]),
        entry("n", "aten.pow.Tensor_Scalar", producers=[1], input_dtypes=["fp32"], output=True),
    ]
    r = _diff(tmp_path, a, b)
    assert r.first_divergence is None and r.outputs.tolerance == 1e-2


def test_ops_with_no_counterpart_are_the_divergence_when_the_next_paired_entry_differs(tmp_path):
    """B computes the Linear as one addmm, A as two half products added: nothing pairs inside
    it; the residual add after it differs while everything before agreed, so the Linear is named,
    with each side's ops."""
    a = [
        entry("mlp.act", "aten.mul.Tensor", producers=[None]),
        entry("mlp.down", "aten.mm.default", shape=[2, 1], producers=[0]),
        entry("mlp.down", "aten.mm.default", shape=[2, 1], producers=[0]),
        entry("mlp.down", "aten.add.Tensor", shape=[2, 1], producers=[1, 2]),
        entry("layer", "aten.add.Tensor", absmax=2.0, producers=[None, 3], output=True),
    ]
    b = [
        entry("mlp.act", "aten.mul.Tensor", producers=[None]),
        entry("mlp.down", "aten.addmm.default", producers=[None, 0]),
        entry("layer", "aten.add.Tensor", absmax=2.5, producers=[None, 1], output=True),
    ]
    r = _diff(tmp_path, a, b)
    d = r.to_dict()["first_divergence"]
    assert (d["module"], d["module_type"], d["op"]) == ("mlp.down", "M", None)
    assert d["unmatched"] == {
        "a": ["aten.mm.default", "aten.mm.default", "aten.add.Tensor"],
        "b": ["aten.addmm.default"],
    }
    assert d["compared_at"]["module"] == "layer" and d["inputs_agree"] is True
    assert r.to_dict()["first_difference"]["unmatched"] == d["unmatched"]


def test_module_level_names_a_module_whose_outputs_differ_even_when_its_inputs_differ_too(tmp_path):
    """Never "no divergence" where a module's outputs differ beyond tolerance."""
    other = {"absmax": 2.0, "mean": 0.0, "l2": 2.0}
    a = [entry("x", absmax=3.0, inp=other)]
    b = [entry("x", absmax=1.0, inp={"absmax": 1.0, "mean": 0.0, "l2": 1.0})]
    r = _diff(tmp_path, a, b, level="modules")
    assert r.first_divergence.verdict.a.module == "x" and not r.first_divergence.inputs_agree


def test_first_difference_is_bitwise(tmp_path):
    """Within tolerance everywhere, but exp's bits differ while mm's (its input) do not."""
    a = [
        entry("m", "aten.mm.default", producers=[None], hash="00000001"),
        entry("m", "aten.exp.default", producers=[0], hash="00000002"),
        entry("m", "aten.relu.default", producers=[1], hash="00000003", output=True),
    ]
    b = [
        entry("m", "aten.mm.default", producers=[None], hash="00000001"),
        entry("m", "aten.exp.default", absmax=1.0001, producers=[0], hash="0000000f"),
        entry("m", "aten.relu.default", absmax=1.0001, producers=[1], hash="0000000e", output=True),
    ]
    r = _diff(tmp_path, a, b)
    assert r.first_divergence is None and r.first_difference.verdict.a.op == "aten.exp.default"
    assert r.outputs.equal == "within_tolerance" and r.exit_code == 0
