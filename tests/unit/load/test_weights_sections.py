"""load/weights_sections.py: the weights block beyond per-tensor rows — ``suspicious`` (finite values
past 1e30: uninitialised memory; weight matrices entirely zero; quantization scales judged by their
own format instead), ``quantized`` and its faulty entries, ``unchecked``."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.weights import scan_weights
from nan_hunter.load.weights_sections import HUGE, bad_scales, suspicious, weights_sections


def _ws(tmp_path, tensors):
    save_file(tensors, str(tmp_path / "m.safetensors"))
    return scan_weights(open_checkpoint(tmp_path / "m.safetensors"))


@pytest.mark.parametrize(
    "name, tensor, reason",
    [
        ("w", torch.full((2, 2), 3e30), "huge"),
        ("w", torch.zeros(4, 4), "all_zero"),
        ("w", torch.zeros(2, 2, 2), "all_zero"),
    ],
)
def test_suspicious(tmp_path, name, tensor, reason):
    (s,) = suspicious(_ws(tmp_path, {name: tensor}))
    assert (s["name"], s["reason"]) == (name, reason)
    assert s["absmax"] == (0.0 if reason == "all_zero" else pytest.approx(3e30, rel=1e-6))


@pytest.mark.parametrize(
    "tensor",
    [
        torch.zeros(4),  # a zero bias is normal
        torch.full((2, 2), HUGE / 2),
        torch.tensor(
            [[0.0, float("nan")], [0.0, 0.0]]
        ),  # not finite: reported as non-finite, not as all zero
        torch.zeros(0, 4),
    ],
)
def test_not_suspicious(tmp_path, tensor):
    assert suspicious(_ws(tmp_path, {"w": tensor})) == []


def test_quantization_scales_are_judged_by_their_format_not_as_matrices(tmp_path):
    w = torch.zeros(256, 128).to(torch.float8_e4m3fn)
    scale = torch.zeros(2, 1)  # all zero, but a block scale: the format judges it block by block
    ws = _ws(tmp_path, {"l.weight": w, "l.weight_scale_inv": scale})
    assert suspicious(ws) == [] and bad_scales(ws) == []


def test_bad_scales_are_the_faulty_quantized_weights(tmp_path):
    w = torch.ones(4, 8).to(torch.float8_e4m3fn)
    ws = _ws(
        tmp_path,
        {
            "a.weight": w,
            "a.weight_scale": torch.tensor(math.nan),
            "b.weight": w.clone(),
            "b.weight_scale": torch.tensor(2.0),
        },
    )
    (bad,) = bad_scales(ws)
    assert bad["name"] == "a.weight" and bad["bad_blocks"][0]["problem"] == "nan"


def test_sections(tmp_path):
    ws = _ws(
        tmp_path,
        {
            "a.weight": torch.ones(4, 8).to(torch.float8_e4m3fn),
            "a.weight_scale": torch.tensor(2.0),
            "z": torch.zeros(3, 3),
            "i": torch.ones(2, dtype=torch.int8),
        },
    )
    sec = weights_sections(ws)
    assert set(sec) == {"unchecked", "quantized", "suspicious"}
    assert [q["name"] for q in sec["quantized"]] == ["a.weight"] and sec["quantized"][0][
        "dequant_absmax"
    ] == 2.0
    assert [s["name"] for s in sec["suspicious"]] == ["z"]
    assert sec["unchecked"] == ws.unchecked
