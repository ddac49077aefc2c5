"""Pairs of runs of the same model that differ in one way, for ``nanhunter diff``
(tests/integration/test_diff_verdicts.py) and for the oracle's own recording of the same runs
(tests/integration/test_diff_oracle.py). Each side is a ``Run``: how to build the model and the
setting it runs under; ``forward(run, record)`` runs it once on ``IDS`` (or ``X``) inside the
recorder ``record(model)`` gives, and returns the output.

- ``dtype``: a tiny Llama (built from a config, fixed seed) in fp16 against bf16;
- ``kernel``: two bf16 runs where one Linear's kernel changed — ``down_proj`` of layer 0 computes
  its K in two halves (``mm, mm, add, add`` where the other run has one ``addmm``);
- ``flush_denormal``: ``Whisper``, whose side branch carries only subnormals (x · 1e-39, then
  · 4e19 → 4e-20·x) into a residual sum of order 1; under ``torch.set_flush_denormal(True)`` the
  branch is 0, and the outputs are bitwise those of the default run;
- ``threads``: the tiny Llama in fp32 on 1 thread against 2;
- ``compiled``: ``trace_nets.build_cancel`` in fp16, eager against ``torch.compile`` (inductor).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

IDS = torch.tensor([[1, 5, 17, 42, 99, 7, 3, 250]])
SPLIT = "model.layers.0.mlp.down_proj"  # the Linear whose kernel changes in ``kernel``


def tiny_llama(dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """A 2-layer Llama with biases (so a Linear is one ``addmm``), weights from ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        max_position_embeddings=64,
        mlp_bias=True,
        attention_bias=True,
        use_cache=False,
    )
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(std=0.02)
    return m.to(dtype)


def split_k(linear: nn.Linear) -> nn.Linear:
    """``linear`` computing x·Wᵀ as two half-K products added (another kernel, the same math)."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        k = linear.in_features // 2
        w = linear.weight
        return x[..., :k] @ w[:, :k].t() + x[..., k:] @ w[:, k:].t() + linear.bias

    linear.forward = forward
    return linear


def llama_split(dtype: torch.dtype) -> nn.Module:
    m = tiny_llama(dtype)
    split_k(m.get_submodule(SPLIT))
    return m


class Whisper(nn.Module):
    """x · 1e-39 (subnormal in fp32, or 0 when flushed) · 4e19: 4e-20·x, or 0."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("tiny", torch.tensor(1e-39))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.tiny) * 4e19


class WhisperNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.side = Whisper()
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        return self.out(h + self.side(h))


X = torch.linspace(-2.0, 2.0, 8 * 16).reshape(8, 16)


def whisper_net() -> nn.Module:
    torch.manual_seed(0)
    return WhisperNet().eval()


def cancel_net() -> nn.Module:
    from models import trace_nets

    torch.manual_seed(0)
    return trace_nets.build_cancel().eval().half()


@contextlib.contextmanager
def flush_denormal(on: bool) -> Iterator[None]:
    torch.set_flush_denormal(on)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class Run:
    build: Callable[[], nn.Module]
    setting: Callable[[], Any] = contextlib.nullcontext
    compiled: bool = False
    tokens: bool = True  # input: IDS (a language model) or X


PAIRS: dict[str, tuple[Run, Run]] = {
    "dtype": (Run(lambda: tiny_llama(torch.float16)), Run(lambda: tiny_llama(torch.bfloat16))),
    "kernel": (Run(lambda: llama_split(torch.bfloat16)), Run(lambda: tiny_llama(torch.bfloat16))),
    "flush_denormal": (
        Run(whisper_net, lambda: flush_denormal(False), tokens=False),
        Run(whisper_net, lambda: flush_denormal(True), tokens=False),
    ),
    "threads": (
        Run(lambda: tiny_llama(torch.float32), lambda: threads(1)),
        Run(lambda: tiny_llama(torch.float32), lambda: threads(2)),
    ),
    "compiled": (Run(cancel_net, tokens=False), Run(cancel_net, compiled=True, tokens=False)),
}


def inputs(run: Run) -> Any:
    return IDS if run.tokens else (X.half() if run.build is cancel_net else X)


def forward(run: Run, record: Callable[[nn.Module], Any]) -> torch.Tensor:
    """Build ``run``'s model and run it once under its setting, inside ``record(model)``."""
    model = run.build()
    x = inputs(run)
    with run.setting(), torch.no_grad():
        target = torch.compile(model, backend="inductor") if run.compiled else model
        with record(model if not run.compiled else target):
            out = target(x)
    return out.logits if hasattr(out, "logits") else out
