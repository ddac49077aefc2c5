"""``integrations.vllm``: the general plugin and the sentinel under vLLM's documented contracts —
an entry point in ``vllm.general_plugins`` whose function vLLM calls with no argument in every
process (possibly more than once); ``LLM.apply_model(func)`` calling ``func(model)``; the root model
called as ``model(input_ids=..., positions=..., intermediate_tensors=..., inputs_embeds=...)``
returning one hidden-state row per token, with ``compute_logits``; the forward context's
``attn_metadata`` (dict layer name -> metadata with ``query_start_loc``) and ``slot_mapping``
(dict layer name -> tensor). vLLM itself does not install here: a root module with vLLM's call
signature and a forward context with its fields stand in."""

from __future__ import annotations

import functools
import importlib
import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from nan_hunter.integrations import vllm as nv

ROOT = Path(__file__).resolve().parents[3]


class Model(nn.Module):
    """vLLM's text-generation interface: token ``bad`` makes its own hidden row +inf."""

    def __init__(self, bad: int = 9) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 4)
        with torch.no_grad():
            self.embed.weight[bad] = float("inf")
        self.head = nn.Linear(4, 16)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        return self.embed(input_ids) * 1.0

    def compute_logits(self, hidden_states):
        return self.head(hidden_states)


def _context(starts=(0, 3, 5), slots=(10, 11, 12, 20, 21)):
    md = SimpleNamespace(query_start_loc=torch.tensor(starts), seq_lens=torch.tensor([3, 2]))
    return SimpleNamespace(
        attn_metadata={"model.layers.0.self_attn.attn": md},
        slot_mapping={"model.layers.0.self_attn.attn": torch.tensor(slots)},
    )


def _run(model, ids=(1, 5, 6, 1, 9), pos=(0, 1, 2, 0, 1)):
    return model(
        input_ids=torch.tensor(ids),
        positions=torch.tensor(pos),
        intermediate_tensors=None,
        inputs_embeds=None,
    )


def test_the_entry_point_is_declared_and_resolves_to_register():
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        "vllm.general_plugins"
    ]
    module, fn = eps["nanhunter"].split(":")
    assert getattr(importlib.import_module(module), fn) is nv.register


def test_a_failing_forward_names_its_request_and_what_it_wrote(tmp_path):
    log = tmp_path / "vllm.jsonl"
    model = Model()
    # as LLM.apply_model(functools.partial(attach, log=...)) calls it: func(model)
    sentinel = functools.partial(nv.attach, log=str(log), context=_context)(model)
    assert nv.attach(model) is sentinel  # idempotent
    _run(model, ids=(1, 5, 6, 1, 2))  # finite: nothing written
    out = _run(model)
    assert torch.isinf(out).any()  # the output is left as it is
    assert sentinel.forwards == 2
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines == [
        {
            "forward": 1,
            "failed": ["row 1"],
            "requests": [
                {"id": "row 0", "positions": [0, 1, 2], "tokens": [1, 5, 6], "kv_slots": [10, 11, 12]},
                {"id": "row 1", "positions": [0, 1], "tokens": [1, 9], "kv_slots": [20, 21]},
            ],
        }
    ]


def test_request_ids_and_the_metadata_slot_mapping_of_older_vllm():
    md = SimpleNamespace(query_start_loc=torch.tensor([0, 1, 2]), slot_mapping=torch.tensor([7, 30]))
    ctx = SimpleNamespace(attn_metadata=[{"l0": md}])  # micro-batched: a list of dicts
    model = Model()
    s = nv.attach(model, context=lambda: ctx, request_ids=lambda: ["cmpl-a", "cmpl-b"])
    _run(model, ids=(9, 4), pos=(5, 8))  # decode: one token each, the first fails
    assert s.failures[0]["failed"] == ["cmpl-a"]
    assert s.failures[0]["requests"][1] == {"id": "cmpl-b", "positions": [8], "tokens": [4], "kv_slots": [30]}


def test_without_a_forward_context_the_forward_is_one_entry():
    model = Model()
    s = nv.attach(model, context=nv.vllm_context)  # vLLM absent here: no context
    _run(model)
    assert s.failures[0]["failed"] == ["batch"] and s.failures[0]["requests"][0]["tokens"] == [1, 5, 6, 1, 9]


def test_register_is_opt_in_and_attaches_to_the_first_model_that_runs(monkeypatch, tmp_path):
    hooks = torch.nn.modules.module._global_forward_pre_hooks
    before = dict(hooks)
    monkeypatch.setattr(nv, "_registered", [])
    monkeypatch.delenv(nv.ENV_LOG, raising=False)
    nv.register()
    assert dict(hooks) == before  # no variable: nothing installed
    log = tmp_path / "plugin.jsonl"
    monkeypatch.setenv(nv.ENV_LOG, str(log))
    try:
        nv.register()
        nv.register()  # vLLM may load plugins more than once
        assert len(hooks) == len(before) + 1
        model = Model()
        model.head(torch.zeros(4))  # a submodule without compute_logits: not attached
        assert len(hooks) == len(before) + 1
        _run(model)
        assert dict(hooks) == before  # attached once, then the global hook is gone
        assert isinstance(getattr(model, nv._ATTACHED), nv.VllmSentinel)
        assert json.loads(log.read_text().splitlines()[0])["failed"] == ["batch"]
    finally:
        for k in set(hooks) - set(before):
            del hooks[k]


def test_attach_refuses_what_is_not_a_model():
    with pytest.raises(TypeError, match="nn.Module"):
        nv.attach(object())
