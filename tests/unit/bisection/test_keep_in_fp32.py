"""bisection.keep_in_fp32: transformers' ``_keep_in_fp32_modules`` is tried on the architecture
before bisect prints it. On Llama (the shipped example) it fails — the model keeps the weights in
fp32 but feeds fp32 activations to an fp16 matmul — so the line is not printed (issue 43)."""

from __future__ import annotations

from pathlib import Path

import torch

from nan_hunter.bisection.keep_in_fp32 import is_transformers_model, try_keep_in_fp32
from nan_hunter.dtypes import RunDtype

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny-llama-fp16"


def test_llama_keep_in_fp32_modules_is_tried_and_refused():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = AutoModelForCausalLM.from_pretrained(EXAMPLE, dtype=torch.float32).eval()
    batch = dict(AutoTokenizer.from_pretrained(EXAMPLE)("the quick brown fox", return_tensors="pt"))
    assert is_transformers_model(m) and not is_transformers_model(torch.nn.Linear(2, 2))
    worked, line = try_keep_in_fp32(str(EXAMPLE), m, ["model.layers.1.mlp.down_proj", "model.norm"],
                                    RunDtype.of("fp16"), [batch])
    assert not worked and "LlamaForCausalLM" in line and "apply the policy instead" in line


def test_not_tried_for_an_fp32_run():
    worked, line = try_keep_in_fp32(str(EXAMPLE), torch.nn.Linear(2, 2), ["x"], RunDtype.of("fp32"), [])
    assert not worked and "not tried" in line
