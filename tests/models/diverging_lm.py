"""Tiny causal language models trained on CPU the way Wortsman et al. (2023) probe instabilities:
a learning rate high enough to diverge, with and without the mitigations (qk-layernorm: Qwen3's
per-head q/k RMSNorm, the Llama otherwise alike; z-loss: 1e-4·log²Z added to the loss), under
fp16 autocast so that a divergence ends in a non-finite value. Shared by
``tests/integration/test_forecast_runs.py`` and ``bench/forecast_lead.py``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

import nan_hunter

VOCAB, SEQ, BATCH = 128, 32, 8


def build(arch: str, seed: int, attn: str = "sdpa") -> torch.nn.Module:
    """A two-layer, 64-wide Llama (``"llama"``) or Qwen3 (``"qwen3"``: the same with qk-layernorm)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **kw))
    else:
        model = LlamaForCausalLM(LlamaConfig(**kw))
    model.config._attn_implementation = attn  # the keyword's name differs across transformers versions
    return model


def batch(g: torch.Generator) -> torch.Tensor:
    """Arithmetic sequences mod VOCAB (a learnable task: the loss falls, the logits sharpen)."""
    a = torch.randint(1, 8, (BATCH, 1), generator=g)
    b = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    return (a * torch.arange(SEQ) + b) % VOCAB


@dataclass
class RunResult:
    arch: str
    lr: float
    seed: int
    z_loss: float
    steps: int = 0
    nan_step: int | None = None  # the first step whose loss was non-finite (None: stayed finite)
    watch_step: int | None = None  # the watch's first_nonfinite step
    warnings: list[dict[str, Any]] = field(default_factory=list)
    forecast_step: int | None = None  # first sampled step with an fp16 crossing projected (medium/high)
    forecast_projected: int | None = None  # the step that projection named
    last_projected: int | None = None  # the fp16 crossing projected at the last sampled step
    projections: list[tuple[int, int]] = field(
        default_factory=list
    )  # (sampled step, fp16 crossing projected)
    seconds: float = 0.0

    @property
    def first_warning(self) -> int | None:
        return min((w["step"] for w in self.warnings), default=None)

    def first_accurate(self, tolerance: float = 0.1) -> int | None:
        """The first sampled step from which every projection names the actual NaN step within
        ``tolerance`` of it (at least 3 steps); None without a NaN or such a step."""
        if self.nan_step is None:
            return None
        tol = max(3.0, tolerance * self.nan_step)
        out = None
        for step, p in self.projections:
            if abs(p - self.nan_step) <= tol:
                out = step if out is None else out
            else:
                out = None
        return out

    def lead(self, step: int | None) -> int | None:
        return self.nan_step - step if self.nan_step is not None and step is not None else None


def _fp16_projection(fc: list[dict[str, Any]] | None) -> int | None:
    steps = [
        e["projected_step"]
        for e in fc or ()
        if e["dtype"] == "fp16" and e["projected_step"] is not None and e["confidence"] != "low"
    ]
    return min(steps, default=None)


def train(
    arch: str = "llama",
    lr: float = 0.1,
    seed: int = 0,
    z_loss: float = 0.0,
    steps: int = 120,
    sample_every: int = 2,
    attn: str = "sdpa",
) -> RunResult:
    """Train with AdamW (no weight decay) under fp16 autocast until the loss goes non-finite or
    ``steps`` end, under ``nan_hunter.watch(level="sentinel", sample_every=...)``."""
    model = build(arch, seed, attn)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    res = RunResult(arch, lr, seed, z_loss)
    t0 = time.perf_counter()
    with nan_hunter.watch(model, optimizer=opt, sample_every=sample_every) as w:
        for step in range(steps):
            x = batch(g)
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(input_ids=x, labels=x)
            loss = out.loss
            if z_loss:
                loss = loss + z_loss * torch.logsumexp(out.logits.float(), -1).square().mean()
            res.steps = step + 1
            if not torch.isfinite(loss):
                res.nan_step = step
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % sample_every == sample_every - 1:  # a sampled step: what the forecast says now
                p = _fp16_projection(w.forecast("fp16"))
                if p is not None:
                    res.last_projected = p
                    res.projections.append((step, p))
                    if res.forecast_step is None:
                        res.forecast_step, res.forecast_projected = step, p
        rep = w.report()
    res.seconds = time.perf_counter() - t0
    res.watch_step = rep.first_nonfinite.step if rep.first_nonfinite is not None else None
    res.warnings = list(rep.report.warnings)
    return res
