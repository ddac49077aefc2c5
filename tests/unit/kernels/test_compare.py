"""The one comparison (``kernels.compare``): its NaN/±inf policy, as stated in its docstring."""

from __future__ import annotations

import math

import pytest
import torch

from nan_hunter.kernels.compare import compare

inf, nan = math.inf, math.nan


@pytest.mark.parametrize(
    "name, cand, ref, error, rel, mismatched",
    [
        ("equal", [1.0, 2.0], [1.0, 2.0], 0.0, 0.0, 0),
        ("relative to the largest |ref|", [1.0, 2.5], [1.0, 2.0], 0.25, 0.25, 0),
        ("matching +inf", [inf, 2.0], [inf, 2.0], 0.0, 0.0, 0),
        ("matching -inf", [-inf, 1.0], [-inf, 1.0], 0.0, 0.0, 0),
        ("matching NaN", [nan, 1.0], [nan, 1.0], 0.0, 0.0, 0),
        ("NaN against a number", [nan, 1.0], [3.0, 1.0], inf, 0.0, 1),
        ("+inf against -inf", [inf, 1.0], [-inf, 1.0], inf, 0.0, 1),
        ("a number against inf", [5.0, 1.0], [inf, 1.0], inf, 0.0, 1),
        ("nothing finite on both sides", [nan], [inf], inf, None, 1),
        ("zero reference, zero candidate", [0.0], [0.0], 0.0, 0.0, 0),
        ("zero reference, non-zero candidate", [1e-3], [0.0], inf, inf, 0),
    ],
)
def test_policy(name, cand, ref, error, rel, mismatched):
    c = compare(torch.tensor(cand), torch.tensor(ref))
    assert c.error == error, name
    assert (c.rel_err is None) if rel is None else c.rel_err == pytest.approx(rel), name
    assert c.mismatched == mismatched, name


def test_structure_differences_are_infinitely_apart():
    assert compare([torch.ones(2)], [torch.ones(3)]).error == inf
    assert compare([torch.ones(2)], [torch.ones(2), torch.ones(2)]).error == inf
    assert not compare([torch.ones(2)], [torch.ones(3)]).same_structure


def test_compared_in_float64_whatever_the_dtypes():
    ref = torch.tensor([1.0, 3.0], dtype=torch.float64)
    cand = ref.to(torch.float16)
    assert compare(cand, ref).rel_err == pytest.approx(float((cand.double() - ref).abs().max() / 3.0))


def test_kinds_and_parts():
    c = compare(torch.tensor([nan, inf]), torch.tensor([1.0, 1.0]))
    assert c.kind == "nan" and c.ref_kind is None and not c.finite and c.ref_finite
    assert c.parts(1e-2)
    assert not compare(torch.tensor([1.0]), torch.tensor([1.001])).parts(1e-2)
    assert compare(torch.tensor([1.0]), torch.tensor([1.1])).parts(1e-2)


def test_nested_outputs_are_flattened_in_order():
    a = {"logits": torch.tensor([1.0]), "extra": (torch.tensor([2.0]), torch.tensor([3], dtype=torch.int64))}
    b = {"logits": torch.tensor([1.0]), "extra": (torch.tensor([2.2]), torch.tensor([9], dtype=torch.int64))}
    assert compare(a, b).rel_err == pytest.approx(0.2 / 2.2)  # integer tensors are not compared


def test_every_caller_gets_the_same_answer():
    """replay's rel_err, bisect's error and compile's parting read the same comparison."""
    from nan_hunter.explain.replay import summarize
    from nan_hunter.modes.compiled import compare as compiled_compare

    cand, ref = [torch.tensor([1.0, 2.5])], [torch.tensor([1.0, 2.0])]
    assert summarize(cand, ref)["rel_err"] == compare(cand, ref).error
    assert compiled_compare(ref, cand).rel_err == compare(cand, ref).rel_err


@pytest.mark.parametrize(
    "name, cand, ref, want",
    [
        ("both finite", [1.0, 2.0], [1.0, 2.5], 0.2),
        ("identical", [1.0, -2.0], [1.0, -2.0], 0.0),
        ("candidate nan", [math.nan, 2.0], [1.0, 2.0], None),
        ("reference +inf", [1.0, 2.0], [math.inf, 2.0], None),
        ("matching -inf on both sides", [-math.inf, 2.0], [-math.inf, 2.0], None),
        ("zero reference, non-zero candidate", [1.0], [0.0], None),
        ("zero reference, zero candidate", [0.0], [0.0], 0.0),
    ],
)
def test_finite_rel_err_only_where_both_runs_are_finite(name, cand, ref, want):
    got = compare(torch.tensor(cand), torch.tensor(ref)).finite_rel_err
    assert got == pytest.approx(want) if want is not None else got is None, name


def test_finite_rel_err_of_different_structures_is_none():
    assert compare([torch.ones(2)], [torch.ones(2), torch.ones(1)]).finite_rel_err is None
