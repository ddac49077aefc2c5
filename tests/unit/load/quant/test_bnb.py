"""load/quant/bnb.py: bitsandbytes checkpoints written by bitsandbytes itself on the CPU (``Linear4bit`` nf4/fp4 with and
without nested quantization, ``Linear8bitLt``), saved from the module's own ``state_dict()`` as
transformers saves them; the dequantized absmax against ``bitsandbytes.functional.dequantize_4bit``;
then corrupted absmax/SCB values, and hostile quant-state JSON (exit 2, one line)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.errors import BadInput
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.weights import scan_weights

bnb = pytest.importorskip("bitsandbytes")
P = "model.layers.0.mlp.up_proj."


def _four_bit(qt: str, nested: bool, seed: int = 0):
    torch.manual_seed(seed)
    lin = bnb.nn.Linear4bit(128, 48, bias=False, quant_type=qt, compress_statistics=nested)
    w = torch.randn(48, 128)
    w[7, 100] = 9.0
    lin.weight = bnb.nn.Params4bit(
        w, requires_grad=False, quant_type=qt, compress_statistics=nested, blocksize=64
    )
    lin = lin.to("cpu")  # bitsandbytes quantizes here
    ref = float(bnb.functional.dequantize_4bit(lin.weight.data, lin.weight.quant_state).abs().max())
    return {P + k: v.contiguous() for k, v in lin.state_dict().items()}, ref


def _eight_bit():
    torch.manual_seed(1)
    lin = bnb.nn.Linear8bitLt(128, 48, bias=False, has_fp16_weights=False)
    w = torch.randn(48, 128)
    w[3] = 0.0  # an empty row
    lin.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    lin = lin.to("cpu")
    sd = {P + k: v.contiguous() for k, v in lin.state_dict().items()}
    ref = float((sd[P + "weight"].float() * sd[P + "SCB"].unsqueeze(1) / 127).abs().max())
    return sd, ref


def _scan(tmp_path, tensors):
    p = tmp_path / "model.safetensors"
    save_file(tensors, str(p))
    ws = scan_weights(open_checkpoint(p))
    return ws, {q.name: q for q in ws.quantized}


@pytest.mark.parametrize("qt,nested", [("nf4", True), ("nf4", False), ("fp4", True), ("fp4", False)])
def test_four_bit(tmp_path, qt, nested):
    sd, ref = _four_bit(qt, nested)
    ws, q = _scan(tmp_path, sd)
    r = q[P + "weight"]
    assert r.format == f"bnb_{qt}" and r.scale == P + "weight.absmax" and r.n_blocks == 48 * 128 // 64
    assert not r.bad_blocks and not ws.unchecked and not ws.nonfinite
    assert r.dequant_absmax == pytest.approx(ref, rel=1e-5)
    if nested:  # the nested absmax scales every block: a NaN there makes them all NaN
        sd[P + "weight.nested_absmax"] = torch.tensor([math.nan])
        _, q = _scan(tmp_path, sd)
        bad = q[P + "weight"].bad_blocks
        assert bad[0] == {
            "index": [0],
            "scale": "nan",
            "problem": "nan",
            "tensor": P + "weight.nested_absmax",
        }
        assert q[P + "weight"].n_faults == 1 + 96
    else:
        a = sd[P + "weight.absmax"].clone()
        a[5], a[9] = math.nan, 0.0
        sd[P + "weight.absmax"] = a
        _, q = _scan(tmp_path, sd)
        assert q[P + "weight"].bad_blocks == [
            {"index": [5], "scale": "nan", "problem": "nan"},
            {"index": [9], "scale": 0.0, "problem": "zero"},
        ]


def test_eight_bit(tmp_path):
    sd, ref = _eight_bit()
    assert P + "weight_format" in sd
    ws, q = _scan(tmp_path, sd)
    r = q[P + "weight"]
    assert r.format == "bnb_int8" and r.scale == P + "SCB" and r.n_blocks == 48 and not ws.unchecked
    assert r.dequant_absmax == pytest.approx(ref, rel=1e-6)
    scb = sd[P + "SCB"].clone()
    scb[4], scb[3], scb[6] = math.inf, 0.0, 0.0  # row 3 holds no data: its zero SCB is fine
    sd[P + "SCB"] = scb
    _, q = _scan(tmp_path, sd)
    assert q[P + "weight"].bad_blocks == [
        {"index": [4], "scale": "inf", "problem": "inf"},
        {"index": [6], "scale": 0.0, "problem": "zero"},
    ]


@pytest.mark.parametrize(
    "state,why",
    [
        (b'{"quant_type": "nf4", "blocksize": "64", "dtype": "float32", "shape": [48, 128]}', "blocksize"),
        (
            b'{"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [48, 128], "x": 1}',
            "unknown keys",
        ),
        (b"[" * 5000 + b"]" * 5000, "nested deeper"),
        (b'{"quant_type": "nf4", "quant_type": "fp4"}', "given twice"),
        (b'{"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [NaN]}', "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b" " * (70 << 10), "over the"),
    ],
)
def test_hostile_quant_state(tmp_path, state, why):
    sd, _ = _four_bit("nf4", False)
    sd[P + "weight.quant_state.bitsandbytes__nf4"] = torch.tensor(list(state), dtype=torch.uint8)
    with pytest.raises(BadInput) as e:
        _scan(tmp_path, sd)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_quant_state_shape_that_does_not_fit_is_unchecked(tmp_path):
    sd, _ = _four_bit("fp4", False)
    state = json.loads(bytes(sd[P + "weight.quant_state.bitsandbytes__fp4"].tolist()))
    state["shape"] = [48, 256]
    sd[P + "weight.quant_state.bitsandbytes__fp4"] = torch.tensor(
        list(json.dumps(state).encode()), dtype=torch.uint8
    )
    ws, q = _scan(tmp_path, sd)
    assert not q and [u["name"] for u in ws.unchecked] == [P + "weight"]


# --- the format on its own ----------------------------------------------------------------------------
def _state_ck(tmp_path, state: dict):
    from .kit import checkpoint

    return checkpoint(tmp_path, {"s": torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)})


@pytest.mark.parametrize(
    "state, says",
    [
        ({"quant_type": "int4", "blocksize": 64, "shape": [2]}, "quant_type 'int4' / blocksize 64"),
        ({"quant_type": "nf4", "blocksize": 48, "shape": [2]}, "blocksize 48 are not bitsandbytes'"),
        ({"quant_type": "nf4", "blocksize": 64, "shape": [-1]}, "shape [-1] is not a list of sizes"),
        ({"quant_type": "nf4", "blocksize": 64, "shape": []}, "shape [] is not a list of sizes"),
        (
            {"quant_type": "nf4", "blocksize": 64, "shape": [2], "nested_blocksize": 7, "nested_offset": 0.5},
            "nested_blocksize 7 / nested_offset 0.5",
        ),
    ],
)
def test_quant_state_refusals(tmp_path, state, says):
    from nan_hunter.load.quant.bnb import quant_state

    with pytest.raises(BadInput, match=re.escape(says)):
        quant_state(_state_ck(tmp_path, state), "s")


def test_quant_state_as_bitsandbytes_writes_it(tmp_path):
    from nan_hunter.load.quant.bnb import STATE_KEYS, quant_state

    state = {
        "quant_type": "fp4",
        "blocksize": 64,
        "dtype": "float32",
        "shape": [48, 128],
        "nested_blocksize": 256,
        "nested_offset": 0.03,
    }
    assert quant_state(_state_ck(tmp_path, state), "s") == state and set(state) <= STATE_KEYS


def test_eight_bit_rows_through_the_format(tmp_path):
    from nan_hunter.load.quant.bnb import Bnb8bit

    from .kit import checkpoint, graded

    sd, ref = _eight_bit()
    (r,) = graded(Bnb8bit(), checkpoint(tmp_path, sd)).values()
    assert r.n_blocks == 48 and r.bad_blocks == [] and r.dequant_absmax == pytest.approx(ref)
