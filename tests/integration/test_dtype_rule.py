"""Each consumer of the run dtype follows the one rule (``RunDtype``) on fp8 runs: the run itself,
near misses, watch re-runs, the replay matrix, check's headroom and policies."""

from __future__ import annotations

import torch
from torch import nn

import nan_hunter
from nan_hunter.config import load_config
from nan_hunter.dtypes import Fp8Recipe, RunDtype
from nan_hunter.explain.replay import replay
from nan_hunter.model.fp8 import FP8Emulation
from nan_hunter.model.policy import install_hooks, set_precision
from nan_hunter.pipeline.ci_check import forward_rules
from nan_hunter.report import Report

BF16_MAX = torch.finfo(torch.bfloat16).max
TINY_LLAMA = "examples/tiny-llama-fp16"


def _config(tmp_path, text: str) -> str:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return str(p)


def test_fp8_near_misses_measure_against_the_compute_dtype(tmp_path):
    # a threshold so low that every module output is listed: each is measured against bf16's max
    cfg = _config(tmp_path, "near_miss: {overflow_fraction: 1.0e-37, absorbed_intermediates: false}\n")
    rep = nan_hunter.scan(TINY_LLAMA, prompts=["hello world"], dtype="fp8-e4m3", config=cfg, device="cpu")
    near = [m for m in rep.near_misses if m["kind"] == "near_overflow"]
    assert near, "expected near misses with so low a threshold"
    assert all(m["limit"] == BF16_MAX for m in near)
    assert all("448" not in m["message"] and "compute dtype" in m["message"] for m in near)


def test_fp8_compute_fp32_is_honoured_by_the_run(tmp_path):
    cfg = _config(
        tmp_path,
        "fp8: {compute: fp32}\nnear_miss: {overflow_fraction: 1.0e-37, absorbed_intermediates: false}\n",
    )
    rep = nan_hunter.scan(TINY_LLAMA, prompts=["hello world"], dtype="fp8-e4m3", config=cfg, device="cpu")
    near = [m for m in rep.near_misses if m["kind"] == "near_overflow"]
    assert near and all(m["limit"] == torch.finfo(torch.float32).max for m in near)


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


# Unscaled e4m3 without saturation: an operand above 448 becomes NaN (the fp8 max is 448).
RAW_E4M3 = Fp8Recipe("fp8-e4m3", scaling="none", overflow="nonfinite")


def test_watch_fp8_report_reruns_under_fp8_emulation():
    torch.manual_seed(0)
    model = Blocks().to(torch.bfloat16)
    x = torch.full((2, 4), 1000.0, dtype=torch.bfloat16)  # finite in bf16, beyond e4m3's 448
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()  # without emulation nothing goes non-finite
    w = nan_hunter.watch(model, level="blocks", dtype="fp8-e4m3", fp8=RAW_E4M3)
    with w, torch.no_grad(), FP8Emulation(RAW_E4M3):
        model(x)
    r = w.report()
    assert r.first_nonfinite is not None
    assert r.first_nonfinite.module == "layers.0.0"  # refined from the block to the leaf Linear
    assert r.first_nonfinite.op in ("aten.addmm.default", "aten.mm.default")
    assert not any("did not reproduce" in n for n in r.notes)


def test_replay_fp8_columns_use_the_runs_recipe():
    lin = nn.Linear(4, 4)
    x = torch.full((2, 4), 1000.0)
    raw = replay(lin, (x,), {}, RunDtype.of("fp16", RAW_E4M3))
    scaled = replay(lin, (x,), {}, RunDtype.of("fp16"))
    assert raw["fp8-e4m3"]["finite"] is False and raw["fp8-e4m3"]["nan"] > 0
    assert scaled["fp8-e4m3"]["finite"] is True


def test_check_fp8_headroom_follows_the_rule(tmp_path):
    cfg = load_config(_config(tmp_path, "headroom: {activations: {fp8-e4m3: {warn: 0.5, fail: 1.0}}}\n"))
    run = Report(checkpoint={}, mode="check")
    run.run = {"n_inputs": 1, "failed_inputs": []}
    run.modules = [{"module": "fc", "module_type": "Linear", "input_index": 0, "absmax": 1000.0}]
    res = {r.rule: r for r in forward_rules("ck", "fp8-e4m3", run, cfg)}
    head = res["forward.fp8-e4m3.headroom"]
    # 1000 is far beyond 448 but an fp8 run stores activations in bf16: plenty of headroom
    assert head.status == "pass" and head.value == 1000.0 / BF16_MAX


def test_policy_fp8_low_dtype_stores_in_bf16():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    set_precision(model, "fp8-e4m3", {"1": "fp32"})
    assert model[0].weight.dtype == torch.bfloat16 and model[1].weight.dtype == torch.float32
    handles = install_hooks(model, "fp8-e4m3", {"1": "fp32"})
    try:
        out = model(torch.ones(1, 4, dtype=torch.bfloat16))
    finally:
        for h in handles:
            h.remove()
    assert out.dtype == torch.bfloat16  # the kept module's output is cast back to the compute dtype
