"""Fuzz quantized-weight recognition (issue 25): tensors named like quantized weights and scales
(``.weight_scale_inv``, ``.weight_scale``, ``_blocks``/``_scales``, ``weight_packed``,
``weight_shape``, ``weight_zero_point``, global scales) with random dtypes and shapes. Every case
ends in a scan (exit 0 or 1; a layout that does not fit is listed in ``weights.unchecked``) or
exit 2 with one line, never another exception. Seeded."""

from __future__ import annotations

import random

import torch
from safetensors.torch import save_file

import nan_hunter
from nan_hunter.errors import BadInput

SEED = 2526
N = 80
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8,
          torch.int8, torch.int32, torch.int64, torch.float8_e8m0fnu, torch.bool]
SUFFIXES = [".weight", ".weight_scale_inv", ".weight_scale", ".weight_packed", ".weight_shape",
            ".weight_zero_point", ".weight_scale_2", ".weight_global_scale", "_blocks", "_scales"]


def _shape(rng: random.Random) -> list[int]:
    return [rng.choice([0, 1, 2, 3, 16, 32, 128, 130]) for _ in range(rng.randrange(0, 4))]


def _tensor(rng: random.Random, dtype, shape):
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * torch.empty((), dtype=dtype).element_size(),), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    return raw.view(dtype).reshape(shape) if dtype != torch.bool else (raw[:n] & 1).bool().reshape(shape)


def test_random_quantized_layouts(tmp_path):
    rng = random.Random(SEED)
    codes = []
    seen = {"quantized": 0, "unchecked": 0}
    for i in range(N):
        tensors = {}
        for _ in range(rng.randrange(1, 5)):
            name = "m.l" + rng.choice(SUFFIXES)
            tensors[name] = _tensor(rng, rng.choice(DTYPES), _shape(rng))
        if rng.random() < 0.5:  # a consistent pair, mangled a little
            rows, cols = rng.choice([(128, 128), (256, 130), (4, 32)])
            w = _tensor(rng, torch.float8_e4m3fn, [rows, cols])
            tensors["b.l.weight"] = w
            tensors["b.l.weight_scale_inv"] = _tensor(rng, rng.choice(DTYPES[:3]),
                                                      [-(-rows // 128) + rng.choice([0, 0, 1]), -(-cols // 128)])
        p = tmp_path / f"q{i}.safetensors"
        save_file(tensors, str(p))
        try:
            rep = nan_hunter.scan(str(p))
            codes.append(rep.exit_code())
            seen["quantized"] += len(rep.weights["quantized"])
            seen["unchecked"] += len(rep.weights["unchecked"])
            for u in rep.weights["unchecked"]:
                assert set(u) == {"name", "dtype", "reason"}
        except BadInput as e:
            assert "\n" not in str(e) and str(e).strip()
            codes.append(2)
    assert set(codes) <= {0, 1, 2}
    assert seen["quantized"] > 5 and seen["unchecked"] > 0, seen  # the cases reach both outcomes
