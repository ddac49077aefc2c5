"""The sampled signals: pre-softmax logits recomputed from SDPA's q and k (masks, causal, GQA) or
read from an eager softmax, the same on real transformers models either way; the Adam state; and
nothing hooked on a step that is not sampled."""

from __future__ import annotations

import math

import pytest
import torch

import nan_hunter
from nan_hunter.capture.signals import (
    ATTENTION,
    LOGSUMEXP,
    SampledSignals,
    attention_modules,
    logits_of,
    sdpa_logit_absmax,
    softmax_logit_absmax,
)


def _scores(q, k, scale=None):
    if k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    return (q.double() @ k.double().transpose(-1, -2)) * (scale or 1 / math.sqrt(q.shape[-1]))


@pytest.mark.parametrize("case", ["plain", "causal", "bool mask", "additive mask", "gqa", "scale"])
def test_sdpa_logits_match_the_eager_scores_over_kept_positions(case):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=g) * 3
    k = torch.randn(2, 2 if case == "gqa" else 4, 7, 8, generator=g) * 3
    s = _scores(q, k, 0.5 if case == "scale" else None)
    kw: dict = {}
    keep = torch.ones(5, 7, dtype=torch.bool)
    if case == "causal":
        kw["is_causal"] = True
        keep = keep.tril()
    elif case == "bool mask":
        keep = torch.rand(2, 1, 5, 7, generator=g) > 0.5
        kw["attn_mask"] = keep
    elif case == "additive mask":
        bias = torch.randn(2, 1, 5, 7, generator=g)
        bias[..., -2:] = torch.finfo(torch.float32).min
        kw["attn_mask"] = bias
        s = s + bias.double()
        keep = bias > -1e30
    elif case == "scale":
        kw["scale"] = 0.5
    want = s.abs().masked_fill(~keep.expand_as(s), 0).max().item()
    assert sdpa_logit_absmax(q, k, **kw) == pytest.approx(want, rel=1e-5)


def test_eager_softmax_input_leaves_masked_positions_out():
    x = torch.tensor([[3.0, -7.5, torch.finfo(torch.float32).min], [1.0, -float("inf"), 2.0]])
    assert softmax_logit_absmax(x) == 7.5


def test_logits_and_attention_modules_are_found_by_name_and_field():
    assert logits_of({"logits": torch.ones(2, 3)}) is not None and logits_of(torch.ones(2)) is None
    mha = torch.nn.Sequential(torch.nn.MultiheadAttention(8, 2))
    assert [n for n, _ in attention_modules(mha)] == ["0"]


def _llama(attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    m = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
        )
    )
    m.config._attn_implementation = attn
    return m


def _gpt2(attn: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32))
    m.config._attn_implementation = attn
    return m


def _signals_of(model, x, mask=None):
    with nan_hunter.watch(model, sample_every=1) as w:
        with torch.no_grad():
            model(input_ids=x, attention_mask=mask)
    return w.signals.signals


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama-gqa", "gpt2"])
def test_sdpa_and_eager_attention_give_the_same_logit_max(build):
    x = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding: those keys take no part
    got = {attn: _signals_of(build(attn), x, mask) for attn in ("sdpa", "eager")}
    att = {a: {k[0]: v[0][1] for k, v in s.series.items() if k[1] == ATTENTION} for a, s in got.items()}
    assert len(att["sdpa"]) == 2 and att["sdpa"].keys() == att["eager"].keys()
    for name, v in att["sdpa"].items():
        assert v == pytest.approx(att["eager"][name], rel=1e-3), name
    lz = got["sdpa"].series[("", LOGSUMEXP)][0][1]
    assert lz == pytest.approx(got["eager"].series[("", LOGSUMEXP)][0][1], rel=1e-4) and lz > 0


def test_only_sampled_steps_hook_and_the_adam_state_is_read_after_the_step():
    model = _llama("sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-3)  # eps above every gradient's RMS
    attn = [m for _, m in attention_modules(model)]
    x = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    with nan_hunter.watch(model, optimizer=opt, sample_every=3) as w:
        base = len(opt._optimizer_step_pre_hooks)  # the watch's own
        for step in range(6):
            out = model(input_ids=x, labels=x)
            (out.loss * 1e-6).backward()
            sampled = step % 3 == 2
            assert w.signals.step_pending == sampled
            assert not any(
                m._forward_hooks or m._forward_pre_hooks for m in attn
            )  # removed at the forward's end
            opt.step()
            opt.zero_grad()
            assert not w.signals.step_pending and len(opt._optimizer_step_pre_hooks) == base
    s = w.signals.signals
    assert s.steps == [2, 5] and [st for st, _ in s.grad_norms] == [2, 5]
    assert [a.step for a in s.adam] == [2, 5] and s.adam[-1].below_eps > 0.99 and s.adam[-1].eps == 1e-3
    assert [w_.code for w_ in w.precursors()] == ["update_collapse"]


def test_sampled_signals_alone_record_absmax_per_block():
    sig = SampledSignals(torch.nn.Linear(2, 2))
    sig.sample_start(4)
    sig.sample_end(4, [("layers.0", 3.0), ("", float("nan"))], {"logits": torch.tensor([[0.0, 0.0]])})
    assert (
        sig.signals.series[("layers.0", "absmax")] == [(4, 3.0)] and ("", "absmax") not in sig.signals.series
    )
    assert sig.signals.series[("", LOGSUMEXP)][0][1] == pytest.approx(math.log(2))


def test_the_forecast_is_measured_against_the_autocast_dtype_first():
    model = _llama("sdpa")
    x = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    with nan_hunter.watch(model, sample_every=1) as w:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for _ in range(3):
                model(input_ids=x)
                with torch.no_grad():
                    model.model.embed_tokens.weight.mul_(4.0)  # the blocks' outputs grow 4x a step
        fc = w.forecast()
    assert fc and fc[0]["dtype"] in ("bf16", "fp16")
    assert {e["dtype"] for e in fc} == {
        "bf16",
        "fp16",
    }  # the run's (autocast) and the targets; never fp32, no fp8
