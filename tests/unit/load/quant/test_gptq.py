"""load/quant/gptq.py: GPTQ's packing — codes along the input dim (2/4/8-bit: 32/bits a word; 3-bit:
32 codes in 3 words), zero points of the declared convention (v1 stores zero - 1), and what is not
read (bit widths, tags, formats, shapes) unchecked with the reason. (Against gptqmodel's own
dequantization and the convention check: test_gptq_awq.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.quant.gptq import CONVENTIONS, Gptq, gptq_codes, group_names

from .kit import checkpoint, context, detect, graded

DATA = Path(__file__).resolve().parents[3] / "data" / "quant"
EXPECTED = json.loads((DATA / "expected.json").read_text())
LAYER = "model.layers.0.mlp.down_proj"


def _stream_words(codes: list[int], bits: int) -> list[int]:
    stream = sum(c << (i * bits) for i, c in enumerate(codes))
    n = -(-len(codes) * bits // 32)
    out = []
    for k in range(n):
        v = (stream >> (32 * k)) & 0xFFFFFFFF
        out.append(v - (1 << 32) if v >= 1 << 31 else v)
    return out


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_codes_along_the_input_dim(bits):
    rng = np.random.default_rng(bits)
    n_in = 32  # one 3-bit triple of words; 32 // bits words of the other widths
    codes = rng.integers(0, 1 << bits, (n_in, 3))
    words = np.array([_stream_words(codes[:, c].tolist(), bits) for c in range(3)], dtype=np.int32).T
    got = gptq_codes(np.ascontiguousarray(words), bits)
    assert got.dtype == np.int32 and np.array_equal(got, codes)


def test_other_widths_are_refused():
    with pytest.raises(ValueError, match="5-bit GPTQ packing is not supported"):
        gptq_codes(np.zeros((5, 1), dtype=np.int32), 5)


@pytest.mark.parametrize("case", sorted(k for k in EXPECTED if k.startswith("gptq")))
def test_library_checkpoints(tmp_path, case):
    d = tmp_path / case
    shutil.copytree(DATA / case, d)
    (r,) = graded(Gptq(), open_checkpoint(d)).values()
    assert r.format == "gptq" and r.scale == f"{LAYER}.scales" and not r.bad_blocks
    assert r.dequant_absmax == pytest.approx(EXPECTED[case]["dequant_absmax"], rel=2e-3)


def _layer(tmp_path, qc, qweight=None, scales=None):
    t = {
        f"{LAYER}.qweight": torch.zeros(16, 8, dtype=torch.int32) if qweight is None else qweight,
        f"{LAYER}.qzeros": torch.zeros(1, 1, dtype=torch.int32),
        f"{LAYER}.scales": torch.ones(1, 8, dtype=torch.float16) if scales is None else scales,
    }
    return checkpoint(tmp_path, t, {"quant_method": "gptq", **qc})


@pytest.mark.parametrize(
    "qc, kw, why",
    [
        ({"bits": 5}, {}, "5-bit GPTQ (2, 3, 4 and 8 bits are read)"),
        ({"bits": 4, "checkpoint_format": "marlin"}, {}, "checkpoint_format 'marlin' packs differently"),
        (
            {"bits": 4},
            {"qweight": torch.zeros(16, 8, dtype=torch.int16)},
            "GPTQ qweight/qzeros stored as I16/I32",
        ),
        ({"bits": 4}, {"scales": torch.ones(1, 8, dtype=torch.int8)}, f"scales {LAYER}.scales are I8"),
    ],
)
def test_what_is_not_read_is_said(tmp_path, qc, kw, why):
    found, ctx = detect(Gptq(), _layer(tmp_path, qc, **kw))
    assert found == {} and ctx.unchecked[0]["reason"].startswith(why)
    assert {f"{LAYER}.qweight", f"{LAYER}.qzeros", f"{LAYER}.scales"} <= ctx.claimed


def test_another_methods_checkpoint_is_not_gptqs(tmp_path):
    ck = _layer(tmp_path, {"bits": 4})
    ctx = context(ck)
    ctx.qc = {"quant_method": "awq"}
    assert Gptq().detect(ctx) == []
    assert group_names(ctx, "gptq") == [LAYER]  # the names are there: the method says whose they are
    assert CONVENTIONS == ("gptq", "gptq_v2")
