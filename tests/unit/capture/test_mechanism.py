"""capture.mechanism: the IEEE mechanism of an op's first non-finite element, read from its
operands re-run in float64, per op family (pointwise, matmul, reduction, softmax, norm, loss,
backward formula) and per dtype."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nan_hunter.capture.mechanism import Mechanism, mechanism_of
from nan_hunter.capture.ops import FirstBadOp

INF = math.inf


def located(fn):
    """The first op that made a new non-finite class, as the tool locates it, and its mechanism."""
    mode = FirstBadOp()
    with mode:
        fn()
    ev = mode.result
    assert ev is not None
    return ev.op, ev.mechanism


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


CASES = [
    # (name, op family, fn(dtype), expected op, expected mechanism)
    ("0*inf", "pointwise", lambda d: t([0.0, 1.0], d) * t([INF, 1.0], d), "mul", "0*inf"),
    ("inf-inf", "pointwise", lambda d: t([INF], d) - t([INF], d), "sub", "inf-inf"),
    ("0/0", "pointwise", lambda d: t([0.0, 1.0], d) / t([0.0, 1.0], d), "div", "0/0"),
    ("x/0", "pointwise", lambda d: t([2.0, 1.0], d) / t([0.0, 1.0], d), "div", "x/0"),
    ("inf/inf", "pointwise", lambda d: t([INF], d) / t([INF], d), "div", "inf/inf"),
    ("reciprocal 0", "pointwise", lambda d: t([0.0, 2.0], d).reciprocal(), "reciprocal", "x/0"),
    ("log(0) then ×0", "pointwise", lambda d: torch.log(t([0.0, 1.0], d)) * 0, "mul", "0*inf"),
    ("log of negative", "pointwise", lambda d: torch.log(t([-1.0, 1.0], d)), "log", "domain"),
    ("sqrt of negative", "pointwise", lambda d: torch.sqrt(t([-4.0], d)), "sqrt", "domain"),
    ("acos beyond 1", "pointwise", lambda d: torch.acos(t([2.0], d)), "acos", "domain"),
    ("exp overflow", "pointwise", lambda d: torch.exp(t([100.0], d)), "exp", "overflow"),
    (
        "mul overflow",
        "pointwise",
        lambda d: t([3e38 if d != torch.float16 else 6e4], d) * 4,
        "mul",
        "overflow",
    ),
    (
        "mm overflow",
        "matmul",
        lambda d: (
            torch.full((2, 4), 1e19 if d != torch.float16 else 300.0, dtype=d)
            @ torch.full((4, 2), 1e19 if d != torch.float16 else 300.0, dtype=d)
        ),
        "mm",
        "overflow",
    ),
    ("mm 0*inf", "matmul", lambda d: t([[0.0, 1.0]], d) @ t([[INF], [1.0]], d), "mm", "0*inf"),
    ("mm inf-inf", "matmul", lambda d: t([[1.0, 1.0]], d) @ t([[INF], [-INF]], d), "mm", "inf-inf"),
    (
        "mean over nothing",
        "reduction",
        lambda d: torch.ones(3, 0, dtype=d).mean(1),
        "mean",
        "empty_reduction",
    ),
    ("var of one element", "reduction", lambda d: torch.ones(3, 1, dtype=d).var(1), "var", "empty_reduction"),
    ("sum of +inf and -inf", "reduction", lambda d: t([INF, -INF, 1.0], d).sum(), "sum", "inf-inf"),
    (
        "softmax of a masked row",
        "softmax",
        lambda d: torch.softmax(t([[-INF, -INF], [0.0, 1.0]], d), -1),
        "_softmax",
        "all_masked_row",
    ),
    (
        "layer_norm of a zero row, eps 0",
        "norm",
        lambda d: F.layer_norm(torch.zeros(2, 4, dtype=d), (4,), eps=0.0),
        "native_layer_norm",
        "0*inf",
    ),
    (
        "batch_norm eval, running var 0, eps 0",
        "norm",
        lambda d: F.batch_norm(
            torch.ones(2, 3, dtype=d), torch.zeros(3, dtype=d), torch.zeros(3, dtype=d), eps=0.0
        ),
        "native_batch_norm",
        "x/0",
    ),
    (
        "batch_norm eval, x = running mean, running var 0",
        "norm",
        lambda d: F.batch_norm(
            torch.ones(2, 3, dtype=d), torch.ones(3, dtype=d), torch.zeros(3, dtype=d), eps=0.0
        ),
        "native_batch_norm",
        "0*inf",
    ),
    (
        "batch_norm eval, running var < 0",
        "norm",
        lambda d: F.batch_norm(torch.ones(2, 3, dtype=d), torch.zeros(3, dtype=d), -torch.ones(3, dtype=d)),
        "native_batch_norm",
        "domain",
    ),
    (
        "group_norm, groups of one element, eps 0",
        "norm",
        lambda d: F.group_norm(t([[1.0, 2.0], [3.0, 4.0]], d), 2, eps=0.0),
        "native_group_norm",
        "0*inf",
    ),
    (
        "group_norm, a group of unequal values, eps 0, another of equal ones",
        "norm",
        lambda d: F.group_norm(t([[1.0, 2.0, 3.0, 3.0]], d), 2, eps=0.0),
        "native_group_norm",
        "0*inf",
    ),
    (
        "cross_entropy, every target ignored",
        "loss",
        lambda d: F.cross_entropy(torch.randn(3, 5, dtype=d), torch.tensor([-100, -100, -100])),
        "nll_loss_forward",
        "empty_reduction",
    ),
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_mechanism_per_family_and_dtype(case, dtype):
    name, _family, fn, op, mech = case
    if name == "exp overflow" and dtype != torch.float32:
        pytest.skip("exp(100) overflows fp16 and bf16 too; the fp32 row is the float64-finite case")
    got_op, got = located(lambda: fn(dtype))
    assert got_op.split(".")[1] == op
    assert got == mech


def test_exp_overflow_in_fp16_is_overflow():
    assert located(lambda: torch.exp(t([12.0], torch.float16)))[1] == "overflow"  # e^12 = 1.6e5 > 65504


def test_backward_formula_sqrt_at_zero():
    """SqrtBackward0 divides the incoming gradient by 2·sqrt(0) = 0: x/0."""
    x = torch.zeros(3, requires_grad=True)
    y = torch.sqrt(x).sum()
    mode = FirstBadOp()
    with mode:
        y.backward()
    ev = mode.result
    assert ev.grad_fn == "SqrtBackward0" and ev.mechanism == "x/0"


def test_backward_formula_log_at_zero_is_zero_over_zero():
    """LogBackward0 divides the incoming gradient (0: the log was multiplied by 0) by x = 0: 0/0."""
    x = torch.zeros(2, requires_grad=True)
    y = (torch.zeros(2) * torch.log(x)).sum()
    mode = FirstBadOp()
    with mode:
        y.backward()
    assert mode.result.grad_fn == "LogBackward0" and mode.result.mechanism == "0/0"


def test_backward_formula_where_zero_times_inf():
    """The torch.where gradient trap: the branch left out gets gradient 0, times the inf it held."""
    a = torch.tensor([INF, 1.0])
    b = torch.ones(2, requires_grad=True)
    y = torch.where(torch.tensor([False, True]), a * b, 0.0).sum()
    mode = FirstBadOp()
    with mode:
        y.backward()
    assert mode.result.grad_fn == "MulBackward0" and mode.result.mechanism == "0*inf"


def test_autocast_cpu_div_keeps_fp32():
    """CPU autocast lowers matmuls, not div: the op event's dtype is fp32 under a bf16 autocast."""
    mode = FirstBadOp()
    with torch.autocast("cpu", dtype=torch.bfloat16), mode:
        a = torch.zeros(2, 2) @ torch.zeros(2, 2)
        torch.zeros(2) / (a.sum(0).float() * 0)
    ev = mode.result
    assert ev.mechanism == "0/0" and ev.out_dtype == "float32"


def test_mechanism_enum_values_are_the_contract_strings():
    assert {m.value for m in Mechanism} == {
        "overflow",
        "x/0",
        "0/0",
        "inf/inf",
        "0*inf",
        "inf-inf",
        "log(0)",
        "domain",
        "empty_reduction",
        "all_masked_row",
        "nonfinite_operand",
        "uninitialised_read",
    }


def test_an_op_that_cannot_be_evaluated_gives_none():
    """An out= buffer, or no non-finite element: nothing to classify."""
    assert mechanism_of(torch.ops.aten.add.Tensor, (t([1.0]), t([1.0])), {}, t([1.0])) is None


def test_batch_and_group_norm_of_a_nonfinite_operand():
    """A NaN running mean in eval, an inf in the group being normalised: the operand, not the norm."""
    x = torch.ones(2, 3)
    assert (
        mechanism_of(
            torch.ops.aten.native_batch_norm.default,
            (x, None, None, t([math.nan, 0.0, 0.0]), torch.ones(3), False, 0.1, 1e-5),
            {},
            torch.ops.aten.native_batch_norm.default(
                x, None, None, t([math.nan, 0.0, 0.0]), torch.ones(3), False, 0.1, 1e-5
            ),
        )
        == Mechanism.NONFINITE_OPERAND
    )
    y = t([[1.0, INF, 1.0, 2.0]])
    out = torch.ops.aten.native_group_norm.default(y, None, None, 1, 4, 1, 2, 1e-5)
    assert (
        mechanism_of(torch.ops.aten.native_group_norm.default, (y, None, None, 1, 4, 1, 2, 1e-5), {}, out)
        == Mechanism.NONFINITE_OPERAND
    )
