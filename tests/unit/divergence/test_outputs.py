"""divergence/outputs.py: whether two runs' final outputs differ — bitwise, within tolerance or
not — from the entries that hold them (marked at level ops, the root at level modules, the last
entry of a root call in a trace that marks none)."""

from __future__ import annotations

from nan_hunter.divergence.compare import compare_traces
from nan_hunter.divergence.outputs import EQUAL, output_groups
from nan_hunter.trace.reader import read_trace

from .synthetic import entry, write


def _outputs(tmp_path, a, b, level="ops", **kw):
    r = compare_traces(
        read_trace(write(tmp_path / "a.jsonl", a, level)),
        read_trace(write(tmp_path / "b.jsonl", b, level)),
        **kw,
    )
    return r, r.to_dict()["outputs"]


def test_bitwise_within_and_differ(tmp_path):
    a = [
        entry("m", "aten.mm.default", producers=[None]),
        entry("m", "aten.exp.default", producers=[0], output=True),
    ]
    r, o = _outputs(tmp_path, a, a)
    assert o["equal"] == "bitwise" and o["rel_err"] == 0.0 and r.exit_code == 0
    b = [
        entry("m", "aten.mm.default", producers=[None]),
        entry("m", "aten.exp.default", absmax=1.0005, producers=[0], output=True),
    ]
    r, o = _outputs(tmp_path, a, b)
    assert o["equal"] == "within_tolerance" and 0 < o["rel_err"] < 1e-3 and r.exit_code == 0
    r, o = _outputs(tmp_path, a, b, rtol=1e-5)
    assert o["equal"] == "differ" and r.exit_code == 1


def test_a_divergence_inside_that_does_not_reach_the_output_exits_0(tmp_path):
    """An internal op differs; the output (made from another branch) is bitwise equal."""
    a = [
        entry("m", "aten.mm.default", producers=[None]),
        entry("m", "aten.mul.Tensor", absmax=4.0, producers=[0]),
        entry("m", "aten.relu.default", producers=[0], output=True),
    ]
    b = [
        entry("m", "aten.mm.default", producers=[None]),
        entry("m", "aten.mul.Tensor", absmax=0.0, producers=[0]),
        entry("m", "aten.relu.default", producers=[0], output=True),
    ]
    r, o = _outputs(tmp_path, a, b)
    assert (
        r.first_divergence.verdict.a.op == "aten.mul.Tensor" and o["equal"] == "bitwise" and r.exit_code == 0
    )
    assert compare_traces(r.a, r.b, fail_on="divergence").exit_code == 1


def test_groups_by_root_call():
    from types import SimpleNamespace as S

    es = [
        S(index=0, module="m", input_index=0, step=0, output=False),
        S(index=1, module="", input_index=0, step=0, output=False),
        S(index=2, module="m", input_index=0, step=1, output=True),
    ]
    assert output_groups(es, "modules", False) == {(0, 0): [1]}
    assert output_groups(es, "ops", True) == {(0, 1): [2]}
    assert output_groups(es, "ops", False) == {(0, 0): [1], (0, 1): [2]}
    assert EQUAL[-1] == "differ"


def test_an_output_with_no_counterpart_differs(tmp_path):
    a = [entry("m", "aten.mm.default", producers=[None], output=True)]
    b = [entry("m", "aten.addmm.default", producers=[None], output=True)]
    r, o = _outputs(tmp_path, a, b)
    assert o["equal"] == "differ" and o["unpaired"] == 1 and r.exit_code == 1
