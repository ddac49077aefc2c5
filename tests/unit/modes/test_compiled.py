"""The pure parts of ``scan --compile`` (nan_hunter/modes/compiled.py) and of watching compiled models
(capture/compiled_regions.py): output comparison, option checks, compile state restored,
eager names."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from nan_hunter.capture.compiled_regions import eager_name, eager_named_modules, unwrap
from nan_hunter.modes.compiled import Parting, compare, fresh_compiles


@pytest.mark.parametrize(
    "name, eager, compiled, expect",
    [
        ("identical", [1.0, -2.0], [1.0, -2.0], Parting(True, True, 0.0)),
        ("relative to max |eager|", [10.0, -4.0], [10.0, -3.9], Parting(True, True, 0.1 / 10.0)),
        ("nan only compiled", [1.0, 2.0], [1.0, math.nan], Parting(True, False, 0.0, "nan", None)),
        ("inf only eager", [1.0, math.inf], [1.0, 5.0], Parting(False, True, 0.0, None, "posinf")),
        ("nothing finite in both", [math.nan], [math.nan], Parting(False, False, None, "nan", "nan")),
    ],
)
def test_compare(name, eager, compiled, expect):
    got = compare({"out": torch.tensor(eager)}, {"out": torch.tensor(compiled)})
    assert got.eager_finite == expect.eager_finite and got.compiled_finite == expect.compiled_finite
    assert got.compiled_kind == expect.compiled_kind and got.eager_kind == expect.eager_kind
    assert got.rel_err == pytest.approx(expect.rel_err) if expect.rel_err is not None else got.rel_err is None


def test_a_different_structure_is_infinitely_far():
    assert compare((torch.ones(2),), (torch.ones(3),)).rel_err == math.inf


@pytest.mark.parametrize(
    "p, parts",
    [
        (Parting(True, True, 0.02), True),
        (Parting(True, True, 0.005), False),
        (Parting(True, False, 0.0), True),
        (Parting(False, True, 0.0), True),
        (Parting(False, False, None), False),
    ],
)
def test_parts_at_rtol(p, parts):
    assert p.parts(1e-2) is parts


@pytest.mark.parametrize(
    "eager, compiled",
    [
        ([math.nan, 1.0], [math.inf, 1.0]),  # both non-finite, another class
        ([math.nan, 1.0], [1.0, math.nan]),  # both non-finite, at other elements
        ([-math.inf, 2.0], [math.inf, 2.0]),
    ],
)
def test_runs_that_are_both_non_finite_part_where_the_classes_differ(eager, compiled):
    """As the one comparison counts them (``Comparison.error`` is inf), not only by finiteness."""
    p = compare({"out": torch.tensor(eager)}, {"out": torch.tensor(compiled)})
    assert not p.eager_finite and not p.compiled_finite
    assert p.error == math.inf and p.parts(1e-2)
    assert not compare({"out": torch.tensor(eager)}, {"out": torch.tensor(eager)}).parts(1e-2)


def test_emulate_flag_is_restored_even_on_error():
    import torch._inductor.config as cfg

    before = cfg.emulate_precision_casts
    with pytest.raises(RuntimeError), fresh_compiles(emulate_precision_casts=not before):
        assert cfg.emulate_precision_casts is (not before)
        raise RuntimeError("boom")
    assert cfg.emulate_precision_casts is before


def test_eager_names_drop_orig_mod():
    m = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))
    m[1] = torch.compile(m[1], backend="eager")
    cm = torch.compile(m, backend="eager")
    assert unwrap(cm) is m
    assert eager_name("_orig_mod.1._orig_mod.1") == "1.1"
    names = [n for n, _ in eager_named_modules(m)]
    assert names == ["", "0", "1", "1.0", "1.1"]
