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
    worked, line = try_keep_in_fp32(
        str(EXAMPLE), m, ["model.layers.1.mlp.down_proj", "model.norm"], RunDtype.of("fp16"), [batch]
    )
    assert not worked and "LlamaForCausalLM" in line and "apply the policy instead" in line


def test_not_tried_for_an_fp32_run():
    worked, line = try_keep_in_fp32(str(EXAMPLE), torch.nn.Linear(2, 2), ["x"], RunDtype.of("fp32"), [])
    assert not worked and "not tried" in line


def test_bisect_lines_never_cut_a_name_at_80_columns():
    """Issue 43: at 80 columns the printed list was cut mid-name. Every module name, kept and in the
    transformers line (when it is printed), appears whole in the 80-column view."""
    import io

    from rich.console import Console

    from nan_hunter.render.terminal.scan_view import bisect_view
    from nan_hunter.report import BisectResult, Report

    names = [f"model.layers.{i}.mlp.down_proj" for i in range(6)] + ["model.norm"]
    rep = Report(
        mode="bisect", bisect=BisectResult("fp16", "fp32", names, 9, True, 1e-3, keep_in_fp32_modules=names)
    )
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None, markup=False).print(bisect_view(rep, 80))
    text = buf.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert all(text.count(n) >= 2 for n in names), text  # its keep line and the transformers line, uncut
