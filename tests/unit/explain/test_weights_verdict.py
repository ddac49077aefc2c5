"""``explain.weights_verdict``: the report's ``weights`` block and the verdict of the weights alone,
made without torch."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from nan_hunter.config import default_config
from nan_hunter.explain.weights_verdict import weights_section, weights_verdict
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.weights import scan_weights
from nan_hunter.report import Report


def _report(tmp_path, tensors):
    save_file(tensors, str(tmp_path / "w.safetensors"))
    ws = scan_weights(open_checkpoint(tmp_path / "w.safetensors"))
    return Report(weights=weights_section(ws, default_config())), ws


def test_clean_weights_have_no_verdict(tmp_path):
    rep, ws = _report(tmp_path, {"a": torch.ones(4)})
    weights_verdict(rep, default_config(), ws)
    assert rep.diagnosis is None and rep.weights["nonfinite"] == [] and rep.weights["n_tensors"] == 1


def test_non_finite_weights_are_the_verdict_unless_the_model_ran_finite(tmp_path):
    rep, ws = _report(tmp_path, {"a": torch.tensor([1.0, float("nan")]), "b": torch.full((2,), 70000.0)})
    weights_verdict(rep, default_config(), ws)
    assert rep.diagnosis.cause == "nonfinite_weights" and rep.weights["nonfinite"][0]["name"] == "a"
    assert [t["name"] for t in rep.weights["near_overflow"]] == ["b"]  # past fp16's max: no headroom there
    weights_verdict(rep, default_config(), ws, scales_only=True)  # the model ran and stayed finite
    assert rep.diagnosis is None
