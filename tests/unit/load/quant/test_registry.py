"""load/quant/registry.py: the formats in claiming order (most specific first, the catch-all last), a
new one registered before a named one or the catch-all, ``quantization_config`` read from config.json
(a broken one is the model builder's to report), and a layout that does not fit its format unchecked
with the reason, never an internal error; the checks judge IEEE results (an overflow to inf is reported,
never a numpy warning or error, whatever the caller's numpy error setting), the caller's setting put
back."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.quant import registry
from nan_hunter.load.quant.fp8 import Fp8
from nan_hunter.load.quant.orphans import ScalesNotFound

from .kit import checkpoint


def test_claiming_order():
    names = [f.name for f in registry.FORMATS]
    assert names[0] == "gguf" and names[-1] == "scales_not_found"
    assert names.index("gptq") < names.index("awq") < names.index("fp8")  # AWQ shares GPTQ's names
    assert names.index("nvfp4") < names.index("fp8") < names.index("scale")


class Named:
    def __init__(self, name):
        self.name = name


@pytest.mark.parametrize(
    "before, at", [("fp8", "fp8"), (None, "scales_not_found"), ("nope", "scales_not_found")]
)
def test_register(monkeypatch, before, at):
    monkeypatch.setattr(registry, "FORMATS", list(registry.FORMATS))
    fmt = Named("mine")
    registry.register(fmt, before=before)
    names = [f.name for f in registry.FORMATS]
    assert names[names.index("mine") + 1] == at


@pytest.mark.parametrize(
    "config, qc",
    [
        (None, {}),
        ({"model_type": "llama"}, {}),
        ({"quantization_config": {"quant_method": "fp8"}}, {"quant_method": "fp8"}),
        ({"quantization_config": ["not", "a", "mapping"]}, {}),
        ("{ not json", {}),
    ],
)
def test_quantization_config(tmp_path, config, qc):
    d = tmp_path / "ck"
    d.mkdir()
    from safetensors.torch import save_file

    save_file({"w": torch.ones(1)}, str(d / "model.safetensors"))
    if config is not None:
        (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    assert registry.quantization_config(open_checkpoint(d)) == qc


def test_find_and_scan(tmp_path):
    w = torch.full((4, 4), 2.0).to(torch.float8_e4m3fn)
    ck = checkpoint(
        tmp_path,
        {
            "a.weight": w,
            "a.weight_scale": torch.tensor(3.0),
            "b.weight": torch.ones(2, 2, dtype=torch.int8),
            "c.weight": torch.ones(2),
        },
    )
    found, unchecked, claimed = registry.find_quantized(ck)
    assert [(q.name, q.format) for q in found] == [("a.weight", "fp8_tensor")]
    assert unchecked == [{"name": "b.weight", "dtype": "I8", "reason": "scales not found"}]
    assert claimed == {"a.weight", "a.weight_scale", "b.weight"}
    scans, unchecked = registry.scan_quantized(ck)
    assert [(s.name, s.dequant_absmax) for s in scans] == [("a.weight", 6.0)] and len(unchecked) == 1


def test_a_layout_that_does_not_fit_is_unchecked_not_an_error(tmp_path, monkeypatch):
    class Broken(Fp8):
        def blocks(self, ck, q):
            raise IndexError("index 9 is out of bounds")

    monkeypatch.setattr(registry, "FORMATS", [Broken(), ScalesNotFound()])
    ck = checkpoint(
        tmp_path, {"a.weight": torch.ones(2, 2).to(torch.float8_e4m3fn), "a.weight_scale": torch.ones(1)}
    )
    scans, unchecked = registry.scan_quantized(ck)
    assert scans == [] and unchecked == [
        {
            "name": "a.weight",
            "dtype": "fp8_tensor",
            "reason": "does not fit the fp8_tensor layout (IndexError: index 9 is out of bounds)",
        }
    ]


def test_checks_judge_ieee_results_and_put_the_callers_error_setting_back(tmp_path, monkeypatch):
    seen = []

    class Recording(Fp8):
        def blocks(self, ck, q):
            seen.append(np.geterr())
            return super().blocks(ck, q)

    monkeypatch.setattr(registry, "FORMATS", [Recording()])
    # 448 * 1e38 overflows float32: non-finite dequantized values (not an error); v1.4: the absmax is over
    # finite values (none known here), and the count of non-finite values is not known
    ck = checkpoint(
        tmp_path,
        {
            "a.weight": torch.full((2, 2), 448.0).to(torch.float8_e4m3fn),
            "a.weight_scale": torch.tensor([1e38]),
        },
    )
    with np.errstate(all="raise"):
        scans, unchecked = registry.scan_quantized(ck)
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "raise", "invalid": "raise"}
    assert seen == [{"divide": "ignore", "over": "ignore", "under": "ignore", "invalid": "ignore"}]
    assert unchecked == [] and [(s.dequant_absmax, s.dequant_nonfinite, s.overflows) for s in scans] == [
        (None, None, {"fp16": True, "bf16": True})
    ]
