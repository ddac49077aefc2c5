"""``capture.ops.first_bad_op``: which op made the first non-finite value, −inf included: a −inf
made from ordinary finite values is an overflow (named first), one written as a mask is not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.capture.ops import first_bad_op


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _then_nan(y: torch.Tensor) -> torch.Tensor:
    """A later op that turns the −inf into NaN (−inf + inf), as a matmul over mixed signs does."""
    return y.float() + torch.where(torch.isinf(y), float("inf"), 0.0)


HALF_MIN = torch.finfo(torch.float16).min


@pytest.mark.parametrize(
    ("name", "fn", "first"),
    [
        (
            "cast of a weight at -1e6 to fp16",
            lambda x: _then_nan((x * 0 - 1e6).to(torch.float16)),
            "aten._to_copy.default",
        ),
        (
            "product past fp16's max",
            lambda x: _then_nan((x.half() * 300) * -x.half() * 300),
            "aten.mul.Tensor",
        ),
        (
            "masked_fill with -inf",
            lambda x: _then_nan(x.masked_fill(x > 0.5, float("-inf"))),
            "aten.add.Tensor",
        ),
        (
            "two finfo.min planes",
            lambda x: _then_nan(torch.full_like(x.half(), HALF_MIN) + HALF_MIN),
            "aten.add.Tensor",
        ),
        ("mask times -1e9 in fp16", lambda x: _then_nan((x.half() > 0.5).half() * -1e9), "aten.add.Tensor"),
        ("log of zero", lambda x: _then_nan(torch.log(x * 0)), "aten.add.Tensor"),
    ],
)
def test_neginf_from_ordinary_values_is_the_first_fault(name, fn, first):
    ev, _ = first_bad_op(Fn(fn), (torch.full((4, 4), 2.0),), {})
    assert ev is not None and ev.op == first, name
