"""divergence/precision.py: which ops only move or widen values (never where two runs part), and
the precision each entry's value carries (the dtypes its tolerance is taken from)."""

from __future__ import annotations

from types import SimpleNamespace as S

import pytest

from nan_hunter.divergence.precision import carried_dtypes, is_exact, op_name, widens


def op(name: str, dtype: str = "fp32", inputs: tuple = ("fp32",), producers: tuple = ()):
    return S(op=name, dtype=dtype, input_dtypes=inputs, producers=producers)


@pytest.mark.parametrize(
    "entry, exact",
    [
        (op("aten._to_copy.default", "fp32", ("bf16",)), True),  # widening cast: exact
        (op("aten._to_copy.default", "fp32", ("fp16",)), True),
        (op("aten._to_copy.default", "fp64", ("fp32",)), True),
        (op("aten._to_copy.default", "bf16", ("fp32",)), False),  # narrowing cast rounds
        (op("aten._to_copy.default", "fp16", ("bf16",)), False),  # bf16's range is not fp16's
        (op("aten._to_copy.default", "fp32", ()), False),  # inputs' dtypes unknown: not assumed exact
        (op("aten.cat.default"), True),
        (op("aten.index_select.default"), True),
        (op("aten.embedding.default", "bf16", ("bf16",)), True),
        (op("aten.copy_.default", "fp32", ("fp16", "fp32")), True),
        (op("aten.mm.default"), False),
        (op("aten.add.Tensor"), False),
        (S(op=None, dtype="fp32", input_dtypes=("fp32",)), False),  # a module entry
    ],
)
def test_is_exact(entry, exact):
    assert is_exact(entry) is exact


def test_widens_and_op_name():
    assert widens("bf16", "fp32") and widens("fp32", "fp32") and not widens("fp32", "bf16")
    assert widens("fp8-e4m3", "bf16") and not widens(None, "fp32")
    assert op_name("aten._to_copy.default") == "_to_copy" and op_name(None) is None


def test_carried_dtypes_follow_the_producers():
    """A bf16 value upcast to fp32, squared in fp32, summed in fp32: all carry bf16's rounding; an
    fp32 op on a weight only carries fp32."""
    entries = [
        op("aten.add.Tensor", "bf16", ("bf16",)),
        op("aten._to_copy.default", "fp32", ("bf16",), (0,)),
        op("aten.pow.Tensor_Scalar", "fp32", ("fp32",), (1,)),
        op("aten.mean.dim", "fp32", ("fp32",), (2,)),
        op("aten.mm.default", "fp32", ("fp32",), (None,)),
    ]
    got = carried_dtypes(entries)
    assert got[3] == {"bf16", "fp32"} and got[4] == {"fp32"}
