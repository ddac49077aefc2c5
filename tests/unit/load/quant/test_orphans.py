"""load/quant/orphans.py: integer, fp8 and fp4 layer weights no format claimed — their scales were not
found, so they are listed as unchecked ("scales not found"), never called clean; float weights and
tensors already claimed are left alone."""

from __future__ import annotations

import pytest
import torch

from nan_hunter.load.quant.orphans import ScalesNotFound

from .kit import checkpoint, detect


@pytest.mark.parametrize(
    "name, tensor, tag",
    [
        ("l.weight", torch.ones(2, 2, dtype=torch.int8), "I8"),
        ("l.qweight", torch.ones(2, 2, dtype=torch.int32), "I32"),
        ("l.weight_packed", torch.ones(2, 2, dtype=torch.uint8), "U8"),
        ("m.proj_blocks", torch.ones(2, 16, dtype=torch.uint8), "U8"),
        ("l.weight", torch.ones(2, 2).to(torch.float8_e4m3fn), "F8_E4M3"),
    ],
)
def test_unclaimed_quantized_weights_are_unchecked(tmp_path, name, tensor, tag):
    found, ctx = detect(ScalesNotFound(), checkpoint(tmp_path, {name: tensor}))
    assert found == {} and ctx.unchecked == [{"name": name, "dtype": tag, "reason": "scales not found"}]


@pytest.mark.parametrize(
    "name, tensor",
    [
        ("l.weight", torch.ones(2, 2)),  # a float weight: the plain scan checks it
        ("l.weight", torch.ones(2, dtype=torch.bool)),
        ("l.bias", torch.ones(2, dtype=torch.int8)),  # not a weight name
        ("embed.position_ids", torch.arange(4)),
    ],
)
def test_everything_else_is_left_alone(tmp_path, name, tensor):
    found, ctx = detect(ScalesNotFound(), checkpoint(tmp_path, {name: tensor}))
    assert found == {} and ctx.unchecked == [] and ctx.claimed == set()
