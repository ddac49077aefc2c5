"""Writes the GPTQ and AWQ fixtures in this folder with the libraries' own code (run by hand, not by
the tests; the tests read what it wrote):

- GPTQ: gptqmodel 7.7.0's ``BaseQuantLinear.pack_block`` (qweight, qzeros, scales, g_idx) and
  ``dequantize_weight`` (the reference absmax), and its v2 -> v1 zero-point conversion
  (``utils/model_dequant.py``: ``_revert_gptq_v1_qzeros_correction`` with ``unpack_cols``/``pack_cols``),
  extracted from the sdist's source with ``ast`` and run as they are (gptqmodel 7.7 needs torch 2.14, so
  the package itself cannot be installed next to torch 2.13).
- AWQ: AutoAWQ 0.2.9's ``WQLinear_GEMM.from_linear`` / ``WQLinear_GEMV.from_linear`` and
  ``awq.utils.packing_utils.dequantize_gemm`` (imported without the package's ``__init__``, which pulls
  ``datasets``).

    pip download --no-deps gptqmodel==7.7.0 autoawq==0.2.9 && tar xzf ... (into SDIST below)
    python tests/data/quant/make_fixtures.py /path/to/sdists
"""

from __future__ import annotations

import ast
import json
import math
import os
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch as t
import torch.nn as nn
import transformers
from safetensors.torch import save_file
from torch.nn.modules.conv import _ConvNd

HERE = Path(__file__).resolve().parent
LAYER = "model.layers.0.mlp.down_proj"


def _extract(src: Path, funcs: set[str], methods: set[str], g: dict) -> dict:
    tree = ast.parse(src.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in funcs:
            exec(compile(ast.Module([node], []), str(src), "exec"), g)
            out[node.name] = g[node.name]
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in methods and item.name not in out:
                    item.decorator_list = []
                    ns: dict = {}
                    exec(compile(ast.Module([item], []), str(src), "exec"), g, ns)
                    out[item.name] = ns[item.name]
    missing = (funcs | methods) - set(out)
    assert not missing, missing
    return out


def gptqmodel_code(root: Path):
    g = {
        "t": t,
        "torch": t,
        "np": np,
        "nn": nn,
        "transformers": transformers,
        "_ConvNd": _ConvNd,
        "os": os,
        "math": math,
        "ThreadPoolExecutor": ThreadPoolExecutor,
        "PLANAR_BITS": (5, 6, 7),
        "env_flag": lambda name: name == "GPTQMODEL_DISABLE_PACK_EXT",
        "log": types.SimpleNamespace(debug=print, warning=print, info=print),
        "Optional": __import__("typing").Optional,
        "Dict": dict,
        "List": list,
        "Tuple": tuple,
        "Any": object,
    }
    ql = _extract(
        root / "gptqmodel/nn_modules/qlinear/__init__.py",
        {"_torch_right_shift", "_torch_left_shift"},
        {
            "pack_block",
            "dequantize_weight",
            "_dequantize_from_codes",
            "_init_wf_unsqueeze_buffers",
            "_wf_device",
        },
        g,
    )
    md = _extract(
        root / "gptqmodel/utils/model_dequant.py",
        {
            "unpack_cols",
            "pack_cols",
            "_unpack_cols_3bit",
            "_pack_cols_3bit",
            "_shift_gptq_qzeros",
            "_revert_gptq_v1_qzeros_correction",
            "_require_int32_words_for_3bit",
        },
        set(),
        g,
    )

    class QL(nn.Module):
        def __init__(self, bits, in_f, out_f):
            super().__init__()
            self.bits, self.in_features, self.out_features = bits, in_f, out_f
            self.pack_dtype, self.pack_dtype_bits, self.planar = t.int32, 32, False
            self.maxq = 2**bits - 1
            self.pack_np_math_dtype, self.pack_np_dtype = np.uint32, np.int32
            self.pack_factor = 32 // bits
            self.dequant_dtype = t.int16 if bits == 8 else t.int8
            self.enable_wf_unsqueeze = True

    for k in (
        "pack_block",
        "dequantize_weight",
        "_dequantize_from_codes",
        "_init_wf_unsqueeze_buffers",
        "_wf_device",
    ):
        setattr(QL, k, ql[k])
    return QL, md["_revert_gptq_v1_qzeros_correction"]


def gptq_case(QL, to_v1, name, bits, sym, v1, act_order=False, out_f=64, in_f=256, gs=64, seed=0):
    gen = t.Generator().manual_seed(seed)
    W = t.randn(out_f, in_f, generator=gen) * 0.05
    W[3, 7] = 0.9  # one large weight: the absmax
    G = in_f // gs
    maxq = 2**bits - 1
    g_idx = t.arange(in_f, dtype=t.int32) // gs
    if act_order:
        g_idx = g_idx[t.randperm(in_f, generator=gen)].contiguous()
    cols = [W[:, g_idx == g] for g in range(G)]
    if sym:
        xmax = t.stack([c.abs().amax(1) for c in cols], 1)
        scale, zero = 2 * xmax / maxq, t.full((out_f, G), float((maxq + 1) // 2))
    else:
        mx, mn = t.stack([c.amax(1) for c in cols], 1), t.stack([c.amin(1) for c in cols], 1)
        scale = (mx - mn).clamp(min=1e-8) / maxq
        zero = t.round(-mn / scale).clamp(0, maxq)
    lin = nn.Linear(in_f, out_f, bias=False)
    lin.weight.data = W
    q = QL(bits, in_f, out_f)
    q.pack_block(lin, scale, zero, g_idx)
    ref = float(q.dequantize_weight().abs().max())
    qzeros = to_v1(q.qzeros, bits) if v1 else q.qzeros
    tensors = {
        f"{LAYER}.qweight": q.qweight,
        f"{LAYER}.qzeros": qzeros,
        f"{LAYER}.scales": q.scales,
        f"{LAYER}.g_idx": q.g_idx.to(t.int32),
    }
    qc = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": gs,
        "desc_act": act_order,
        "sym": sym,
        "checkpoint_format": "gptq" if v1 else "gptq_v2",
    }
    return name, tensors, qc, ref


def awq_code(root: Path):
    pkg = root / "awq"
    for name in ("awq", "awq.utils", "awq.modules", "awq.modules.linear"):
        m = types.ModuleType(name)
        m.__path__ = [str(pkg.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = m
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.modules.linear.gemv import WQLinear_GEMV
    from awq.utils.packing_utils import dequantize_gemm

    return WQLinear_GEMM, WQLinear_GEMV, dequantize_gemm


def awq_cases(GEMM, GEMV, dequantize_gemm, out_f=64, in_f=256, gs=64):
    gen = t.Generator().manual_seed(1)
    lin = nn.Linear(in_f, out_f, bias=False)
    lin.weight.data = t.randn(out_f, in_f, generator=gen) * 0.05
    lin.weight.data[5, 9] = -0.8
    w = lin.weight.data.reshape(out_f, -1, gs)
    mx, mn = w.amax(-1), w.amin(-1)
    scales = (mx - mn).clamp(min=1e-5) / 15  # AutoAWQ's pseudo_quantize_tensor (zero_point=True)
    zeros = (-t.round(mn / scales)).clamp(0, 15)
    gemm = GEMM.from_linear(lin, 4, gs, scales=scales.t().contiguous(), zeros=zeros.t().contiguous())
    ref = float(dequantize_gemm(gemm.qweight, gemm.qzeros, gemm.scales, 4, gs).abs().max())
    gemv = GEMV.from_linear(lin, 4, gs, scales=scales.half(), zeros=zeros)
    qc = {"quant_method": "awq", "bits": 4, "group_size": gs, "zero_point": True}
    out = []
    for version, m in (("gemm", gemm), ("gemv", gemv)):
        tensors = {f"{LAYER}.qweight": m.qweight, f"{LAYER}.qzeros": m.qzeros, f"{LAYER}.scales": m.scales}
        out.append((f"awq_{version}", tensors, {**qc, "version": version}, ref))
    return out


def main(sdists: str) -> None:
    root = Path(sdists)
    QL, to_v1 = gptqmodel_code(root / "gptqmodel-7.7.0")
    cases = [gptq_case(QL, to_v1, f"gptq_{b}bit_sym_v1", b, True, True) for b in (2, 3, 4, 8)]
    cases += [
        gptq_case(QL, to_v1, "gptq_4bit_sym_v2", 4, True, False),
        gptq_case(QL, to_v1, "gptq_3bit_asym_v1", 3, False, True),
        gptq_case(QL, to_v1, "gptq_4bit_asym_v2_actorder", 4, False, False, act_order=True),
    ]
    cases += awq_cases(*awq_code(root / "autoawq-0.2.9"))
    expected = {}
    for name, tensors, qc, ref in cases:
        d = HERE / name
        d.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "model.safetensors"))
        (d / "config.json").write_text(
            json.dumps({"model_type": "llama", "quantization_config": qc}, indent=1)
        )
        expected[name] = {"dequant_absmax": ref, "weight": tensors and f"{LAYER}.qweight"}
        print(name, {k: list(v.shape) for k, v in tensors.items()}, ref)
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
