"""load/quant/int_group.py: compressed-tensors integers — int8 with a per-tensor, per-channel or
grouped scale, and ``pack-quantized`` int32 words (values offset by 2**(bits-1), optional packed
zero points): the dequantized absmax is max |q - zero| * scale per group."""

from __future__ import annotations

import pytest
import torch

from nan_hunter.load.quant.int_group import IntGroup

from .kit import checkpoint, detect, graded


@pytest.mark.parametrize(
    "scale, absmax, n_blocks",
    [
        (torch.tensor(0.5), 63.5, 1),  # per tensor: 127 * 0.5
        (torch.tensor([[0.5], [2.0]]), 200.0, 2),  # per channel: row 1 holds 100
        (torch.tensor([[0.5, 0.25], [1.0, 0.125]]), 100.0, 4),  # groups of 4
    ],
)
def test_int8(tmp_path, scale, absmax, n_blocks):
    w = torch.tensor([[127, 0, 0, 1, -3, 0, 2, 0], [100, 0, 0, 0, 0, 0, 0, -1]], dtype=torch.int8)
    (r,) = graded(IntGroup(), checkpoint(tmp_path, {"l.weight": w, "l.weight_scale": scale})).values()
    assert (r.format, r.n_blocks, r.dequant_absmax) == ("int_group", n_blocks, absmax)


def _pack4(codes: list[list[int]]) -> torch.Tensor:
    """4-bit values (already offset by 8) eight per int32 word, little-endian."""
    words = []
    for row in codes:
        ws = []
        for k in range(0, len(row), 8):
            v = sum(c << (4 * i) for i, c in enumerate(row[k : k + 8]))
            ws.append(v - (1 << 32) if v >= 1 << 31 else v)
        words.append(ws)
    return torch.tensor(words, dtype=torch.int32)


def test_pack_quantized_int4(tmp_path):
    q = [[8 + 7] + [8] * 15, [8 - 8] + [8] * 15]  # row 0: +7, row 1: -8, the rest zero
    ck = checkpoint(
        tmp_path,
        {
            "l.weight_packed": _pack4(q),
            "l.weight_scale": torch.tensor([[1.0, 1.0], [0.5, 3.0]]),
            "l.weight_shape": torch.tensor([2, 16]),
        },
        {
            "quant_method": "compressed-tensors",
            "config_groups": {"g": {"weights": {"num_bits": 4, "group_size": 8}}},
        },
    )
    found, ctx = detect(IntGroup(), ck)
    assert "l.weight_shape" in ctx.claimed
    (r,) = graded(IntGroup(), ck).values()
    assert (r.n_blocks, r.dequant_absmax) == (4, 7.0)  # row 1: 8 * 0.5 = 4 < 7


def test_a_zero_scale_on_a_group_with_data_is_bad(tmp_path):
    w = torch.tensor([[0, 0, 0, 0, 5, 0, 0, 0]], dtype=torch.int8)
    (r,) = graded(
        IntGroup(), checkpoint(tmp_path, {"l.weight": w, "l.weight_scale": torch.tensor([[0.0, 0.0]])})
    ).values()
    assert r.bad_blocks == [{"index": [0, 1], "scale": 0.0, "problem": "zero"}]  # group 0 is all zeros: fine


def test_scales_that_fit_nothing(tmp_path):
    found, ctx = detect(
        IntGroup(),
        checkpoint(
            tmp_path, {"l.weight": torch.zeros(2, 8, dtype=torch.int8), "l.weight_scale": torch.ones(3, 2)}
        ),
    )
    assert found == {} and ctx.unchecked[0]["name"] == "l.weight"
