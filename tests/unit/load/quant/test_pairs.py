"""load/quant/pairs.py: a weight and its scale found by name — ``.weight_scale_inv`` (DeepSeek-V3),
``.weight_scale`` (compressed-tensors, modelopt, Quark), ``.scale`` (DeepSeek-V4), the packed
data preferred, claimed tensors left alone, a scale without its data skipped."""

from __future__ import annotations

import pytest
import torch

from nan_hunter.load.quant.pairs import Pair, weight_scale_pairs

from .kit import checkpoint, context


def _pairs(tmp_path, names, claimed=()):
    ck = checkpoint(tmp_path, {n: torch.ones(1) for n in names})
    ctx = context(ck)
    ctx.claim(*claimed)
    return list(weight_scale_pairs(ctx))


@pytest.mark.parametrize(
    "names, pair",
    [
        (["l.weight", "l.weight_scale_inv"], Pair("l.weight", "l.weight_scale_inv", "l.weight", "scale_inv")),
        (["l.weight", "l.weight_scale"], Pair("l.weight", "l.weight_scale", "l.weight", "weight_scale")),
        (["l.weight", "l.scale"], Pair("l.weight", "l.scale", "l.weight", "scale")),
        (
            ["l.weight", "l.weight_packed", "l.weight_scale"],  # the packed codes, not a stray .weight
            Pair("l.weight_packed", "l.weight_scale", "l.weight", "weight_scale"),
        ),
    ],
)
def test_found(tmp_path, names, pair):
    assert _pairs(tmp_path, names) == [pair]


@pytest.mark.parametrize(
    "names, claimed",
    [
        (["l.weight_scale"], ()),  # no data
        (["l.weight", "l.weight_scale"], ("l.weight",)),  # data claimed by an earlier format
        (["l.weight", "l.weight_scale"], ("l.weight_scale",)),
        (["l.bias", "l.input_scale"], ()),  # not a weight's scale
    ],
)
def test_not_found(tmp_path, names, claimed):
    assert _pairs(tmp_path, names, claimed) == []


def test_in_name_order(tmp_path):
    got = _pairs(tmp_path, ["b.weight", "b.weight_scale", "a.weight", "a.weight_scale_inv"])
    assert [p.data for p in got] == ["a.weight", "b.weight"]
