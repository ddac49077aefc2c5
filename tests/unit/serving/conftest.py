"""Packed forwards of the real transformers continuous-batching manager, captured once."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers.generation.continuous_batching")


@pytest.fixture(scope="module")
def packed_calls():
    """(model, [(PackedStep read live, the forward's tensors copied, its logits)] of each packed root
    forward) of one ``generate_batch`` over three prompts, the second overflowing at decode step 1
    (``tests/models/serving_llama.py``); the manager's static buffers are reused by every step, so
    what each step held is read while it runs."""
    import torch
    from models.serving_llama import cb_config, greedy, serving_llama

    from nan_hunter.serving.packed import logits_of, packed_step

    model = serving_llama("sdpa")
    calls = []
    now = {}

    def copied(v):
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, list):
            return [copied(x) for x in v]
        if isinstance(v, dict):
            return {k: copied(x) for k, x in v.items()}
        return v

    def keep(module, args, kwargs):
        now["step"], now["kwargs"] = (
            packed_step(kwargs),
            {k: copied(v) for k, v in kwargs.items() if k != "cache"},
        )

    def done(module, args, kwargs, output):
        calls.append((now["step"], now["kwargs"], logits_of(output).clone()))

    h = model.register_forward_pre_hook(keep, with_kwargs=True)
    h2 = model.register_forward_hook(done, with_kwargs=True)
    try:
        model.generate_batch(
            [[1, 14, 15, 16], [1, 3, 4, 5], [1, 20, 21]],
            generation_config=greedy(3),
            continuous_batching_config=cb_config(),
            progress_bar=False,
        )
    finally:
        h.remove()
        h2.remove()
    return model, calls
