"""``integrations.sglang``: the hook factory under SGLang's documented ``--forward-hooks`` contract
(``hook_factory(config)`` → ``hook(module, inputs, output)``, registered with
``register_forward_hook`` on the matched modules; the root model called as
``model(input_ids, positions, forward_batch)``). SGLang itself does not install here: a root module
with SGLang's call signature and ``ForwardBatch``/``LogitsProcessorOutput`` fields stands in."""

from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import torch
from torch import nn

from nan_hunter.integrations.sglang import forward_batch_step, hook_factory


class Root(nn.Module):
    """Returns one logits row per request; request ``bad`` gets NaN."""

    def __init__(self, bad: int | None) -> None:
        super().__init__()
        self.bad = bad

    def forward(self, input_ids, positions, forward_batch):
        logits = torch.zeros(forward_batch.batch_size, 8)
        if self.bad is not None:
            logits[self.bad, 3] = float("nan")
        return SimpleNamespace(next_token_logits=logits)


def _extend_batch():
    return SimpleNamespace(
        batch_size=2,
        input_ids=torch.tensor([1, 5, 6, 1, 9]),
        positions=torch.tensor([0, 1, 2, 0, 1]),
        extend_seq_lens_cpu=[3, 2],
        rids=["a1", "b2"],
        req_pool_indices=torch.tensor([4, 7]),
        out_cache_loc=torch.tensor([10, 11, 12, 20, 21]),
        seq_lens=torch.tensor([3, 2]),
    )


def test_factory_resolves_as_sglang_resolves_it_and_logs_the_failing_request(tmp_path):
    module, fn = "nan_hunter.integrations.sglang:hook_factory".split(":", 1)
    factory = getattr(importlib.import_module(module), fn)
    log = tmp_path / "serving.jsonl"
    hook = factory({"log": str(log)})
    root = Root(bad=1)
    h = root.register_forward_hook(hook)  # as sglang.srt.model_executor.hook_manager registers it
    try:
        fb = _extend_batch()
        root(fb.input_ids, fb.positions, fb)
    finally:
        h.remove()
    entry = json.loads(log.read_text())
    assert entry["failed"] == ["b2"] and entry["forward"] == 0
    assert entry["requests"][1] == {"id": "b2", "positions": [0, 1], "tokens": [1, 9], "kv_slots": [20, 21]}
    assert hook.forwards == 1 and len(hook.failures) == 1


def test_a_finite_decode_forward_writes_nothing(tmp_path):
    hook = hook_factory({})
    root = Root(bad=None)
    root.register_forward_hook(hook)
    fb = SimpleNamespace(
        batch_size=2,
        input_ids=torch.tensor([3, 4]),
        positions=torch.tensor([5, 9]),
        rids=None,
        req_pool_indices=torch.tensor([4, 7]),
        out_cache_loc=torch.tensor([13, 30]),
    )
    root(fb.input_ids, fb.positions, fb)
    assert hook.forwards == 1 and hook.failures == []
    step = forward_batch_step(fb)
    assert [(r.id, r.positions, r.blocks) for r in step.requests] == [
        ("slot 4", [5], [13]),
        ("slot 7", [9], [30]),
    ]


def test_a_bad_config_is_refused():
    import pytest

    with pytest.raises(ValueError, match="must be a path"):
        hook_factory({"log": 3})
