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
N = 200
DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.uint8,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.float8_e8m0fnu,
    torch.bool,
]
SUFFIXES = [
    ".weight",
    ".weight_scale_inv",
    ".weight_scale",
    ".weight_packed",
    ".weight_shape",
    ".weight_zero_point",
    ".weight_scale_2",
    ".weight_global_scale",
    "_blocks",
    "_scales",
    # issue 34: GPTQ/AWQ, bitsandbytes, DeepSeek-V4, activation/KV scales
    ".qweight",
    ".qzeros",
    ".scales",
    ".g_idx",
    ".SCB",
    ".weight_format",
    ".weight.absmax",
    ".weight.quant_map",
    ".weight.nested_absmax",
    ".weight.nested_quant_map",
    ".weight.quant_state.bitsandbytes__nf4",
    ".scale",
    ".input_scale",
    ".k_scale",
    ".v_scale",
    ".input_global_scale",
]


def _shape(rng: random.Random) -> list[int]:
    return [rng.choice([0, 1, 2, 3, 16, 32, 128, 130]) for _ in range(rng.randrange(0, 4))]


def _tensor(rng: random.Random, dtype, shape):
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(
        0,
        256,
        (n * torch.empty((), dtype=dtype).element_size(),),
        dtype=torch.uint8,
        generator=torch.Generator().manual_seed(rng.randrange(1 << 30)),
    )
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
            tensors["b.l.weight_scale_inv"] = _tensor(
                rng, rng.choice(DTYPES[:3]), [-(-rows // 128) + rng.choice([0, 0, 1]), -(-cols // 128)]
            )
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


def test_random_gptq_awq_bnb_sets(tmp_path):
    """Whole tensor sets of GPTQ/AWQ (qweight, qzeros, scales, g_idx) and bitsandbytes (weight, absmax,
    quant_map, quant state; weight + SCB) with random shapes, dtypes and configs: a scan, or exit 2 with
    one line."""
    import json

    rng = random.Random(SEED + 1)
    codes = []
    for i in range(N // 2):
        d = tmp_path / f"s{i}"
        d.mkdir()
        t = {}
        kind = rng.choice(["gptq", "awq", "bnb4", "bnb8"])
        dims = [0, 1, 3, 8, 16, 32, 64]
        if kind in ("gptq", "awq"):
            bits = 4 if kind == "awq" else rng.choice([2, 3, 4, 8])
            n_in, n_out, groups = rng.choice([96, 192]), rng.choice([32, 64]), rng.choice([1, 2, 3])
            if kind == "gptq":
                shapes = {
                    ".qweight": [n_in * bits // 32, n_out],
                    ".qzeros": [groups, n_out * bits // 32],
                    ".scales": [groups, n_out],
                    ".g_idx": [n_in],
                }
            else:
                shapes = {
                    ".qweight": [n_in, n_out // 8],
                    ".qzeros": [groups, n_out // 8],
                    ".scales": [groups, n_out],
                }
            for k, shape in shapes.items():
                if rng.random() < 0.15:  # mangle one dim
                    shape = [x + rng.choice([-1, 1, 8]) if rng.random() < 0.5 else x for x in shape]
                dt = torch.float16 if k == ".scales" else torch.int32
                if rng.random() < 0.05:
                    dt = rng.choice([torch.int8, torch.float32, torch.int64])
                x = _tensor(rng, dt, [max(0, v) for v in shape])
                if k == ".g_idx" and x.numel():
                    x = (
                        (torch.arange(x.numel()) * groups // x.numel()).to(dt)
                        if rng.random() < 0.6
                        else torch.randint(-1, groups + 1, (x.numel(),)).to(dt)
                    )
                if k == ".scales" and rng.random() < 0.7:
                    x = (torch.rand(x.shape) + 0.01).to(dt)
                t["m.l" + k] = x
            qc = {
                "quant_method": kind,
                "bits": rng.choice([bits, bits, 5]),
                "sym": rng.choice([True, False]),
                "checkpoint_format": rng.choice(["gptq", "gptq_v2", "gptq", "marlin"]),
                "version": rng.choice(["gemm", "gemv", "gemm"]),
                "group_size": n_in // groups,
            }
        elif kind == "bnb4":
            n = rng.choice([0, 32, 64, 100])
            state = {
                "quant_type": rng.choice(["nf4", "fp4", "x"]),
                "blocksize": rng.choice([32, 64, 7]),
                "dtype": "float32",
                "shape": [n],
            }
            if rng.random() < 0.5:
                state.update(
                    nested_blocksize=rng.choice([256, 3]),
                    nested_offset=rng.choice([0.1, "x"]),
                    nested_dtype="float32",
                )
            raw = json.dumps(state).encode()
            if rng.random() < 0.3:
                raw = raw[: rng.randrange(len(raw))]
            bs = state["blocksize"] if state["blocksize"] != 7 else 32
            t["m.l.weight"] = _tensor(rng, torch.uint8, [rng.choice([(n + 1) // 2, (n + 1) // 2, 50])])
            t["m.l.weight.absmax"] = _tensor(
                rng,
                torch.uint8 if "nested_offset" in state else torch.float32,
                [rng.choice([-(-n // bs), -(-n // bs), 2])],
            )
            t["m.l.weight.quant_map"] = _tensor(rng, torch.float32, [rng.choice([16, 3])])
            if "nested_offset" in state:
                t["m.l.weight.nested_absmax"] = _tensor(rng, torch.float32, [1])
                t["m.l.weight.nested_quant_map"] = _tensor(rng, torch.float32, [rng.choice([256, 2])])
            t[f"m.l.weight.quant_state.bitsandbytes__{state['quant_type']}"] = torch.tensor(
                list(raw), dtype=torch.uint8
            )
            qc = {"quant_method": "bitsandbytes"}
        else:
            r, c = rng.choice(dims), rng.choice(dims)
            t["m.l.weight"] = _tensor(rng, rng.choice([torch.int8, torch.uint8]), [r, c])
            t["m.l.SCB"] = _tensor(rng, rng.choice([torch.float32, torch.int32]), [rng.choice([r, r + 1, 0])])
            if rng.random() < 0.5:
                t["m.l.weight_format"] = torch.tensor(rng.choice([0, 1]), dtype=torch.uint8)
            qc = {"quant_method": "bitsandbytes"}
        save_file(t, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps({"quantization_config": qc}))
        try:
            from nan_hunter.load.checkpoint import open_checkpoint
            from nan_hunter.load.weights import scan_weights

            ws = scan_weights(open_checkpoint(d))
            codes.append(1 if any(q.faulty for q in ws.quantized) else 0)
            for u in ws.unchecked:
                assert set(u) == {"name", "dtype", "reason"}
        except BadInput as e:
            assert "\n" not in str(e) and str(e).strip()
            codes.append(2)
    assert set(codes) <= {0, 1, 2} and len(set(codes)) >= 2, codes
