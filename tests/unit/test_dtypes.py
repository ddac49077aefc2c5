"""The one dtype rule: a run's compute dtype, range and fp8 emulation come from one object."""

from __future__ import annotations

import pytest
import torch

from nan_hunter.dtypes import Fp8Recipe, RunDtype, UnknownDtype


@pytest.mark.parametrize(
    "name, compute, range_max",
    [
        ("fp32", torch.float32, torch.finfo(torch.float32).max),
        ("half", torch.float16, 65504.0),
        ("bfloat16", torch.bfloat16, torch.finfo(torch.bfloat16).max),
        # fp8 runs store and compute in bf16: the fp8 max bounds scaled matmul operands, not activations
        ("fp8-e4m3", torch.bfloat16, torch.finfo(torch.bfloat16).max),
        ("e5m2", torch.bfloat16, torch.finfo(torch.bfloat16).max),
    ],
)
def test_compute_and_range(name, compute, range_max):
    run = RunDtype.of(name)
    assert run.torch_compute == compute
    assert run.range.max == range_max


def test_fp8_compute_fp32_recipe_changes_compute_and_range():
    run = RunDtype.of("fp8-e4m3", Fp8Recipe(compute="fp32"))
    assert run.torch_compute == torch.float32 and run.range.name == "fp32"
    assert run.fp8 is not None and run.fp8.fmt == "fp8-e4m3"


def test_recipe_follows_the_name_and_survives_with_name():
    recipe = Fp8Recipe(scaling="rowwise", overflow="nonfinite")
    run = RunDtype.of("fp16", recipe)
    assert run.fp8 is None and not run.is_fp8  # not an fp8 run: no emulation
    e5 = run.with_name("fp8-e5m2")
    assert e5.fp8 is not None and e5.fp8.fmt == "fp8-e5m2" and e5.fp8.scaling == "rowwise"
    assert e5.fp8.overflow == "nonfinite"


@pytest.mark.parametrize("bad", ["int8", "fp64", "float64", ""])
def test_names_that_cannot_run(bad):
    with pytest.raises(UnknownDtype):
        RunDtype.of(bad)


@pytest.mark.parametrize(
    "kw",
    [{"scaling": "blockwise"}, {"overflow": "wrap"}, {"compute": "fp16"}, {"amax_eps": 0}, {"fmt": "fp16"}],
)
def test_recipe_validates_itself(kw):
    with pytest.raises(ValueError):
        Fp8Recipe(**kw)


@pytest.mark.parametrize("name", ["fp64", "fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2"])
def test_limits_from_the_bit_layout_equal_torch_finfo(name):
    """``limits`` derives each format's range from its exponent and mantissa widths (no torch import, so a
    weights-only scan never loads it); torch's finfo is the reference."""
    from nan_hunter.dtypes import limits, torch_dtype

    fi = torch.finfo(torch_dtype(name))
    got = limits(name)
    assert (got.max, got.smallest_normal, got.smallest_subnormal, got.eps) == (
        float(fi.max),
        float(fi.smallest_normal),
        float(fi.smallest_normal * fi.eps),
        float(fi.eps),
    )
    assert got.flush == float(fi.smallest_normal * fi.eps) / 2
