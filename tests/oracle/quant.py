"""The quantized-checkpoint oracle: checkpoints with one planted fault, written in each format's own layout,
and what their weights dequantize to by the format's own library — gguf-py (``gguf.quants.dequantize``),
bitsandbytes (``dequantize_4bit``, ``int8_vectorwise_dequant``), compressed-tensors (``dequantize`` of fp8
block scales). The verdict a ``check --dtypes D`` must give follows from those values alone: it fails
when a dequantized value is NaN/Inf, when a zero scale turned a block holding data into zeros, when a
plain float tensor holds NaN/Inf, or when the largest finite dequantized magnitude is past the policy's
fail fraction of D's max (``configs/ci.yaml``, read as data). Shares no code with nanhunter."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
LAYER = "model.layers.0.mlp.down_proj"
DTYPE_MAX = {"fp16": float(torch.finfo(torch.float16).max), "bf16": float(torch.finfo(torch.bfloat16).max)}

#: format -> the faults that apply to it (a NaN code needs a float code: fp8)
FAULTS = (
    "clean",
    "nan_scale",
    "inf_scale",
    "zero_scale",
    "nan_code",
    "overflow_fp16",
    "overflow_bf16",
    "plain_neginf",
)
NOT_FP8 = tuple(f for f in FAULTS if f != "nan_code")
FORMATS = {
    "fp8_block": FAULTS,
    "fp8_channel": FAULTS,
    "fp8_tensor": FAULTS,
    "int8_group": NOT_FP8,
    "nvfp4": NOT_FP8,
    # E8M0 holds no zero and no inf (0xFF is NaN)
    "mxfp4": ("clean", "nan_scale", "overflow_fp16", "overflow_bf16", "plain_neginf"),
    "gguf_q8_0": tuple(f for f in FAULTS if f != "nan_code"),
    "gguf_q4_0": tuple(f for f in FAULTS if f != "nan_code"),
    "bnb_nf4": tuple(f for f in FAULTS if f != "nan_code"),
    "bnb_fp4": tuple(f for f in FAULTS if f != "nan_code"),
    "bnb_int8": tuple(f for f in FAULTS if f != "nan_code"),
}


def fail_fraction(dtype: str) -> float:
    """``headroom.weights.<dtype>.fail`` of the CI policy."""
    cfg = yaml.safe_load((ROOT / "configs" / "ci.yaml").read_text(encoding="utf-8"))
    return float(cfg["headroom"]["weights"][dtype]["fail"])


@dataclass
class Case:
    path: Path  # what ``check`` is given
    weight: str  # the quantized weight's name as nanhunter reports it
    dequant: np.ndarray  # float64: the weight as the format's library dequantizes it
    clean: np.ndarray  # the same weight without the fault, dequantized by the library
    plain_nonfinite: bool  # a plain float tensor of the checkpoint holds NaN/Inf

    @property
    def nonfinite(self) -> int:
        return int((~np.isfinite(self.dequant)).sum())

    @property
    def absmax(self) -> float | None:
        x = self.dequant[np.isfinite(self.dequant)]
        return float(np.abs(x).max()) if x.size else None

    @property
    def zeroed(self) -> bool:
        """A zero scale made values that hold data 0."""
        return bool(((self.dequant == 0) & (self.clean != 0)).any())

    def overflows(self, dtype: str) -> bool:
        return self.nonfinite > 0 or (self.absmax or 0.0) > DTYPE_MAX[dtype]

    def passes(self, dtype: str) -> bool:
        """The verdict ``check --dtypes dtype`` must give."""
        over = self.absmax is not None and self.absmax / DTYPE_MAX[dtype] > fail_fraction(dtype)
        return not (self.nonfinite or self.zeroed or self.plain_nonfinite or over)


def _norm(fault: str) -> torch.Tensor:
    n = torch.ones(64)
    if fault == "plain_neginf":
        n[3] = -math.inf
    return n


def _scale_value(fault: str, clean: float) -> float:
    return {"nan_scale": math.nan, "inf_scale": math.inf, "zero_scale": 0.0}.get(fault, clean)


def fp8_block(d: Path, fault: str, strategy: str = "block") -> Case:
    """compressed-tensors style weights: e4m3 codes [256, 256] with DeepSeek-style 128x128
    ``weight_scale_inv`` blocks (``block``), a ``weight_scale`` per row (``channel``) or one (``tensor``);
    or int8 codes with a ``weight_scale`` per 32 inputs (``group``). The scale of the block, row or group
    holding element [130, 5] is faulty."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    g = torch.Generator().manual_seed(1)
    if strategy == "group":
        w = torch.randint(-128, 128, (256, 256), generator=g, dtype=torch.int16).to(torch.int8)
    else:
        w = (torch.randn(256, 256, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    shape, at = {
        "block": ((2, 2), (1, 0)),
        "channel": ((256, 1), (130, 0)),
        "tensor": ((1,), (0,)),
        "group": ((256, 8), (130, 0)),
    }[strategy]
    s = torch.full(shape, 0.01)
    bad_w, bad_s = w.clone(), s.clone()
    big = {"overflow_fp16": 1000.0, "overflow_bf16": 1e37}
    bad_s[at] = big.get(fault, _scale_value(fault, 0.01))
    if fault == "nan_code":
        bad_w.view(torch.uint8)[130, 5] = 0x7F
    kw = {"block": {"block_structure": [128, 128]}, "group": {"group_size": 32}}.get(strategy, {})
    args = QuantizationArgs(
        num_bits=8, type="int" if strategy == "group" else "float", strategy=strategy, symmetric=True, **kw
    )

    def deq(codes, scales):
        return dequantize(codes, scales, None, args, dtype=torch.float32).double().numpy()

    d.mkdir(parents=True)
    scale = f"{LAYER}.weight_scale_inv" if strategy == "block" else f"{LAYER}.weight_scale"
    save_file(
        {f"{LAYER}.weight": bad_w, scale: bad_s, "model.norm.weight": _norm(fault)},
        str(d / "model.safetensors"),
    )
    qc = (
        {"quant_method": "fp8", "weight_block_size": [128, 128]}
        if strategy == "block"
        else {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "group_0": {
                    "weights": {
                        "num_bits": 8,
                        "type": args.type,
                        "strategy": strategy,
                        "group_size": kw.get("group_size"),
                    }
                }
            },
        }
    )
    (d / "config.json").write_text(json.dumps({"quantization_config": qc}))
    return Case(
        d / "model.safetensors", f"{LAYER}.weight", deq(bad_w, bad_s), deq(w, s), fault == "plain_neginf"
    )


def nvfp4(d: Path, fault: str) -> Case:
    """compressed-tensors ``nvfp4-pack-quantized``: e2m1 codes packed two a byte (``weight_packed``
    [64, 64]), an e4m3 ``weight_scale`` per 16 values, a ``weight_global_scale`` the scales are divided by;
    dequantized by the library's own ``unpack_fp4_from_uint8`` and ``dequantize``. Group [10, 2]'s scale is
    faulty (e4m3 has no inf: an inf scale is stored as its NaN), or the global scale makes it overflow."""
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, unpack_fp4_from_uint8
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    g = torch.Generator().manual_seed(5)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    codes = grid[torch.randint(0, 8, (64, 128), generator=g)] * torch.where(
        torch.rand(64, 128, generator=g) < 0.5, -1.0, 1.0
    )
    packed = pack_fp4_to_uint8(codes)
    s = torch.full((64, 8), 0.5).to(torch.float8_e4m3fn)
    gs = torch.tensor([1.0])
    bad_s, bad_gs = s.clone(), gs.clone()
    if fault in ("nan_scale", "inf_scale"):
        bad_s.view(torch.uint8)[10, 2] = 0x7F
    elif fault == "zero_scale":
        bad_s[10, 2] = 0.0
    elif fault == "overflow_fp16":
        bad_gs[0] = 1e-5  # 6 x 0.5 / 1e-5 = 3e5
    elif fault == "overflow_bf16":
        bad_gs[0] = 1e-38  # past float32
    args = QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", group_size=16, symmetric=True)

    def deq(scales, global_scale):
        x_q = unpack_fp4_from_uint8(packed, 64, 128)
        with np.errstate(all="ignore"):
            return (
                dequantize(
                    x_q=x_q, scale=scales.to(x_q.dtype), args=args, global_scale=global_scale, dtype=x_q.dtype
                )
                .double()
                .numpy()
            )

    d.mkdir(parents=True)
    save_file(
        {
            f"{LAYER}.weight_packed": packed,
            f"{LAYER}.weight_scale": bad_s,
            f"{LAYER}.weight_global_scale": bad_gs,
            "model.norm.weight": _norm(fault),
        },
        str(d / "model.safetensors"),
    )
    (d / "config.json").write_text(
        json.dumps(
            {
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "format": "nvfp4-pack-quantized",
                    "config_groups": {
                        "group_0": {
                            "weights": {
                                "num_bits": 4,
                                "type": "float",
                                "strategy": "tensor_group",
                                "group_size": 16,
                            }
                        }
                    },
                }
            }
        )
    )
    return Case(
        d / "model.safetensors",
        f"{LAYER}.weight_packed",
        deq(bad_s, bad_gs),
        deq(s, gs),
        fault == "plain_neginf",
    )


def mxfp4(d: Path, fault: str) -> Case:
    """compressed-tensors ``mxfp4-pack-quantized``: e2m1 codes packed two a byte, an E8M0 exponent byte
    per 32 values (``2**(e - 127)``, 0xFF NaN; no zero and no inf), dequantized by the library's own
    ``decompress_mx_scale``, ``unpack_fp4_from_uint8`` and ``dequantize``. Group [10, 2] is faulty."""
    from compressed_tensors.compressors.mx_utils import decompress_mx_scale
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, unpack_fp4_from_uint8
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    g = torch.Generator().manual_seed(6)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    codes = grid[torch.randint(0, 8, (64, 128), generator=g)]
    codes[10, 70] = 6.0  # group [10, 2] holds the largest code
    packed = pack_fp4_to_uint8(codes)
    s = torch.full((64, 4), 126, dtype=torch.uint8)  # 2**-1
    bad = s.clone()
    bad[10, 2] = {"nan_scale": 0xFF, "overflow_fp16": 127 + 15, "overflow_bf16": 254}.get(fault, 126)
    args = QuantizationArgs(num_bits=4, type="float", strategy="group", group_size=32, symmetric=True)

    def deq(scales):
        x_q = unpack_fp4_from_uint8(packed, 64, 128)
        with np.errstate(all="ignore"):
            return (
                dequantize(
                    x_q=x_q, scale=decompress_mx_scale(scales).to(x_q.dtype), args=args, dtype=x_q.dtype
                )
                .double()
                .numpy()
            )

    d.mkdir(parents=True)
    save_file(
        {f"{LAYER}.weight_packed": packed, f"{LAYER}.weight_scale": bad, "model.norm.weight": _norm(fault)},
        str(d / "model.safetensors"),
    )
    (d / "config.json").write_text(
        json.dumps(
            {
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "format": "mxfp4-pack-quantized",
                    "config_groups": {
                        "group_0": {
                            "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}
                        }
                    },
                }
            }
        )
    )
    return Case(d / "model.safetensors", f"{LAYER}.weight_packed", deq(bad), deq(s), fault == "plain_neginf")


def gguf_file(d: Path, fault: str, qtype: str) -> Case:
    """A GGUF file: ``blk.0.ffn_down.weight`` quantized by gguf-py, one block's fp16 d planted."""
    import gguf
    from gguf.quants import dequantize, quantize

    T = gguf.GGMLQuantizationType[qtype]
    x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    q = quantize(x, T)
    bad = q.copy()
    _, size = gguf.GGML_QUANT_SIZES[T]
    v = {"overflow_fp16": 60000.0, "overflow_bf16": 65504.0}.get(fault, _scale_value(fault, 0.0))
    if fault not in ("clean", "plain_neginf"):
        bad[3, size : size + 2] = np.array([v], np.float16).view(
            np.uint8
        )  # row 3, block 1: d (the first field)
    d.mkdir(parents=True)
    path = d / "model.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_tensor("output_norm.weight", _norm(fault).numpy())
    w.add_tensor("blk.0.ffn_down.weight", bad, raw_shape=bad.shape, raw_dtype=T)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with np.errstate(all="ignore"):
        return Case(
            path,
            "blk.0.ffn_down.weight",
            dequantize(bad, T).astype(np.float64),
            dequantize(q, T).astype(np.float64),
            fault == "plain_neginf",
        )


def bnb_4bit(d: Path, fault: str, quant_type: str) -> Case:
    """transformers' bitsandbytes 4-bit layout (``weight`` packed, ``weight.absmax``, ``weight.quant_map``,
    ``weight.quant_state.bitsandbytes__<type>``) from ``quantize_4bit``; absmax block 5 planted."""
    import bitsandbytes.functional as F

    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))
    packed, st = F.quantize_4bit(w, quant_type=quant_type, blocksize=64)
    clean = F.dequantize_4bit(packed, st).double().numpy()
    big = {"overflow_fp16": 1e5, "overflow_bf16": 3e38}
    st.absmax[5] = big.get(fault, _scale_value(fault, float(st.absmax[5])))
    bad = F.dequantize_4bit(packed, st).double().numpy()
    tensors = {f"{LAYER}.weight": packed, "model.norm.weight": _norm(fault)}
    tensors.update({f"{LAYER}.weight.{k}": v for k, v in st.as_dict(packed=True).items()})
    d.mkdir(parents=True)
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(
        json.dumps(
            {
                "quantization_config": {
                    "quant_method": "bitsandbytes",
                    "load_in_4bit": True,
                    "bnb_4bit_quant_type": quant_type,
                }
            }
        )
    )
    return Case(d / "model.safetensors", f"{LAYER}.weight", bad, clean, fault == "plain_neginf")


def bnb_int8(d: Path, fault: str) -> Case:
    """transformers' bitsandbytes int8 layout (``weight`` int8, ``SCB`` per row), dequantized by
    ``int8_vectorwise_dequant``; row 5's SCB planted."""
    import bitsandbytes.functional as F

    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(4))
    codes, scb, _ = F.int8_vectorwise_quant(w)
    clean = F.int8_vectorwise_dequant(codes, scb).double().numpy()
    bad_scb = scb.clone()
    big = {"overflow_fp16": 1e7, "overflow_bf16": 3e38}
    bad_scb[5] = big.get(fault, _scale_value(fault, float(scb[5])))
    bad = F.int8_vectorwise_dequant(codes, bad_scb).double().numpy()
    d.mkdir(parents=True)
    save_file(
        {f"{LAYER}.weight": codes, f"{LAYER}.SCB": bad_scb, "model.norm.weight": _norm(fault)},
        str(d / "model.safetensors"),
    )
    (d / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}})
    )
    return Case(d / "model.safetensors", f"{LAYER}.weight", bad, clean, fault == "plain_neginf")


def build(fmt: str, fault: str, d: Path) -> Case:
    if fmt.startswith("fp8_"):
        return fp8_block(d, fault, fmt.removeprefix("fp8_"))
    if fmt == "int8_group":
        return fp8_block(d, fault, "group")
    if fmt == "nvfp4":
        return nvfp4(d, fault)
    if fmt == "mxfp4":
        return mxfp4(d, fault)
    if fmt.startswith("gguf_"):
        return gguf_file(d, fault, fmt.removeprefix("gguf_").upper())
    if fmt == "bnb_int8":
        return bnb_int8(d, fault)
    return bnb_4bit(d, fault, fmt.removeprefix("bnb_"))
