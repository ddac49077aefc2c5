"""divergence/align.py: which entry of one trace is which of the other — module calls by key
(a call only one side has does not shift the rest), ops by (name, shape) within each call, a
fused op or a new decomposition on one side leaving the ops around it paired."""

from __future__ import annotations

import pytest

from nan_hunter.divergence.align import align, align_modules, align_ops
from nan_hunter.trace.format import Entry, Stats


def _e(
    i: int,
    module: str,
    op: str | None,
    shape: tuple[int, ...] = (2,),
    call: int = 0,
    step: int = 0,
    phase: str = "forward",
) -> Entry:
    return Entry(
        i,
        module,
        "M",
        op,
        call,
        0,
        step,
        phase,
        None,
        None,
        shape,
        "fp32",
        Stats(0, 0, 0, 1.0, 1.0, 0.0, 1.0, "0"),
        None,
    )


def test_align_ops_on_names_within_each_call():
    ta = [_e(0, "x", "aten.a"), _e(1, "x", "aten.b"), _e(2, "x", "aten.c"), _e(3, "y", "aten.a")]
    tb = [_e(0, "x", "aten.a"), _e(1, "x", "aten.extra"), _e(2, "x", "aten.c"), _e(3, "y", "aten.a")]
    assert align_ops(ta, tb) == [(0, 0), (2, 2), (3, 3)]


def test_a_decomposition_on_one_side_keeps_the_ops_around_it():
    """rms_norm as one op in A, pow/mean/add/rsqrt/mul in B (a newer torch): mm before and after pair."""
    ta = [_e(0, "n", "aten.mm"), _e(1, "n", "aten.rms_norm"), _e(2, "n", "aten.mm")]
    tb = [
        _e(0, "n", "aten.mm"),
        *(
            _e(i, "n", op)
            for i, op in enumerate(["aten.pow", "aten.mean", "aten.add", "aten.rsqrt", "aten.mul"], 1)
        ),
        _e(6, "n", "aten.mm"),
    ]
    assert align_ops(ta, tb) == [(0, 0), (2, 6)]


def test_ops_pair_on_shape_too():
    ta = [_e(0, "x", "aten.mm", (2, 2)), _e(1, "x", "aten.mm", (4, 4))]
    tb = [_e(0, "x", "aten.mm", (4, 4))]
    assert align_ops(ta, tb) == [(1, 0)]


def test_ops_of_a_call_only_one_side_ran_are_unmatched():
    ta = [_e(0, "x", "aten.a"), _e(1, "x", "aten.a", call=1)]
    tb = [_e(0, "x", "aten.a", call=1)]
    assert align_ops(ta, tb) == [(1, 0)]


def test_align_modules_by_key():
    ta = [_e(0, "a", None), _e(1, "b", None), _e(2, "", None)]
    tb = [_e(0, "", None)]  # a compiled run: only the root is seen
    assert align_modules(ta, tb) == [(2, 0)]


@pytest.mark.parametrize(
    "b_entry",
    [
        _e(0, "a", None, step=1),  # another decode step
        _e(0, "a", None, phase="backward"),  # the backward of the same call
        _e(0, "a", None, call=1),  # the module's second call
    ],
)
def test_the_key_is_module_call_input_step_and_phase(b_entry):
    assert align_modules([_e(0, "a", None)], [b_entry]) == []


def test_align_dispatches_on_the_level():
    ta, tb = [_e(0, "x", "aten.a")], [_e(0, "x", "aten.b")]
    assert align("ops", ta, tb) == []  # different ops of the same call
    assert align("modules", ta, tb) == [(0, 0)]  # the same call
