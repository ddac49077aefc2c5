"""``modes.forward.ForwardMode``: one no-grad forward per input. On a tiny transformers Llama built
from its config: what one input returns, the first fault located through the harness (an fp16
overflow in one MLP), the fix checked on the whole model only when the model is in memory (not
when placed with ``--device-map``), and the near misses of a clean run at level "ops"."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from torch import nn

from nan_hunter.config import default_config
from nan_hunter.dtypes import RunDtype
from nan_hunter.locate.rerun import KeptSteps
from nan_hunter.model.prepare import Prepared
from nan_hunter.modes.forward import ForwardMode
from nan_hunter.modes.harness import capture, run_mode
from nan_hunter.report import Report

MLP = "model.layers.1.mlp"
IDS = [torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5, 6, 7]])]


def _llama(overflow: bool = False, dtype: torch.dtype = torch.float32):
    """A two-layer LlamaForCausalLM; ``overflow``: layer 1's MLP is made to pass fp16's max in its
    down projection (gate and up all ones, down 1000): finite in fp32 and bf16."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).eval()
    if overflow:
        mlp = m.get_submodule(MLP)
        with torch.no_grad():
            mlp.gate_proj.weight.fill_(1.0)
            mlp.up_proj.weight.fill_(1.0)
            mlp.down_proj.weight.fill_(1e3)
    return m.to(dtype)


class MaskedScores(nn.Module):
    """Scores q·kᵀ that overflow to +inf at the last key, masked to −inf before softmax inside the
    same module: the +inf never reaches a module output (a clean run, with an absorbed op)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8, bias=False)
        with torch.no_grad():
            self.q.weight.copy_(torch.eye(8))

    def forward(self, x):
        s = self.q(x) @ x.transpose(-1, -2)
        mask = torch.zeros(s.shape[-2:], dtype=torch.bool)
        mask[:, -1] = True
        return torch.softmax(s.masked_fill(mask, float("-inf")), -1)


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scores = MaskedScores()

    def forward(self, x):
        return self.scores(x) @ x[..., :4, :]


def _absorbing_input() -> torch.Tensor:
    x = torch.full((1, 4, 8), 0.1)
    x[0, -1] = 1e20  # its score with itself is ~1e41: +inf in fp32, then masked
    return x


def _prepared(model, batches, dtype: str = "fp32", cfg=None) -> Prepared:
    return Prepared(
        None,
        model,
        None,
        "test",
        batches,
        [f"input {i}" for i in range(len(batches))],
        RunDtype.of(dtype),
        torch.device("cpu"),
        cfg or default_config(),
    )


def test_forward_mode_is_what_any_request_falls_back_to():
    assert ForwardMode.wanted(object()) and ForwardMode.wanted(None)
    mode = ForwardMode.from_request({"anything": 1})
    assert isinstance(mode, ForwardMode) and mode.name == "forward"
    assert mode.grad is False and mode.compares_outputs is True and mode.one_step_table is False


def test_run_input_returns_the_models_float_outputs_detached():
    m = _llama()
    kw = {"input_ids": IDS[0]}
    out = ForwardMode().run_input(m, kw, None)
    with torch.no_grad():
        logits = m(**kw).logits
    assert len(out) >= 1 and torch.equal(out[0], logits)
    assert all(t.is_floating_point() and not t.requires_grad for t in out)


def test_an_fp16_overflow_in_a_tiny_llama_is_located_diagnosed_and_its_fix_checked_on_the_whole_model():
    p = _prepared(_llama(overflow=True, dtype=torch.float16), [{"input_ids": t} for t in IDS], "fp16")
    rep = Report()
    run_mode(p, ForwardMode(), rep)
    f = rep.first_nonfinite
    assert f is not None
    assert (f.module, f.op, f.kind, f.role) == (f"{MLP}.down_proj", "aten.mm.default", "posinf", "producer")
    assert f.input_index == 0 and rep.run.failed_inputs[0] == 0
    assert rep.diagnosis.cause == "overflow" and rep.diagnosis.dtype == "fp16"
    assert rep.replay["fp32"]["finite"] and not rep.replay["fp16"]["finite"]
    fv = rep.diagnosis.fix_verified
    assert fv is not None and fv.finite and fv.scope == "model"  # the model is in memory: checked whole


def test_rerun_checks_a_fix_on_the_whole_model_only_when_it_is_not_placed():
    m = _llama(overflow=True, dtype=torch.float16)
    p = _prepared(m, [{"input_ids": t} for t in IDS], "fp16")
    mode = ForwardMode()
    cap = capture(p, mode, [1, 0])  # the group in another order: step 1 is data-set input 0
    rerun = mode.rerun(p, cap)
    assert isinstance(rerun, KeptSteps)
    whole = rerun.whole(1)
    assert whole.model is m and whole.kwargs is p.batches[0] and whole.master is p.master
    assert rerun.whole(0).kwargs is p.batches[1]
    with rerun.around(MLP):  # an unplaced model: nothing to put in place
        pass
    m.hf_device_map = {"": "cpu"}  # placed with --device-map: offloaded weights stay on meta
    try:
        placed = mode.rerun(p, cap)
        assert placed.whole(1) is None
        assert isinstance(placed.around(MLP), contextlib.AbstractContextManager)
    finally:
        del m.hf_device_map


def test_the_placed_models_fix_is_checked_on_its_failing_module_alone():
    m = _llama(overflow=True, dtype=torch.float16)
    m.hf_device_map = {"": "cpu"}
    p = _prepared(m, [{"input_ids": IDS[0]}], "fp16")
    rep = Report()
    run_mode(p, ForwardMode(), rep)
    fv = rep.diagnosis.fix_verified
    assert rep.first_nonfinite.module == f"{MLP}.down_proj"
    assert fv is not None and fv.scope == "region"


def test_a_clean_run_lists_intermediates_absorbed_before_any_module_output():
    p = _prepared(Attn(), [{"x": _absorbing_input()}])
    absorbed = ForwardMode().absorbed(p, [0])
    assert absorbed and all(a["kind"] == "absorbed" and a["dtype"] == "fp32" for a in absorbed)
    assert {a["module"] for a in absorbed} == {"scores"}
    assert any(a["op"] in ("aten.bmm.default", "aten.mm.default") for a in absorbed)
    rep = Report()
    run_mode(p, ForwardMode(), rep)
    assert rep.first_nonfinite is None and rep.run.failed_inputs == []
    assert [a for a in rep.near_misses if a["kind"] == "absorbed"] == absorbed


def test_absorbed_is_empty_when_switched_off_or_without_inputs():
    cfg = default_config()
    off = dataclasses.replace(cfg, near_miss=dataclasses.replace(cfg.near_miss, absorbed_intermediates=False))
    batch = [{"x": _absorbing_input()}]
    assert ForwardMode().absorbed(_prepared(Attn(), batch, cfg=off), [0]) == []
    assert ForwardMode().absorbed(_prepared(Attn(), batch), []) == []
