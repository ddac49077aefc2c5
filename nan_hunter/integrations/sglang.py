"""SGLang's ``--forward-hooks``: a hook factory that keeps the per-request sentinel of every forward.

SGLang (≥ 0.5.23) attaches forward hooks named on its command line::

    --forward-hooks '[{"name": "nanhunter", "target_modules": [""],
                       "hook_factory": "nan_hunter.integrations.sglang:hook_factory",
                       "config": {"log": "/tmp/nanhunter-serving.jsonl"}}]'

It calls ``hook_factory(config)`` once and registers the returned ``hook(module, inputs, output)``
with ``register_forward_hook`` on each module whose name matches a pattern (``""`` is the root
model, called as ``model(input_ids, positions, forward_batch)`` and returning a
``LogitsProcessorOutput``). The hook reads the batch's own bookkeeping from the ``ForwardBatch``
(``rids``, ``seq_lens``, ``extend_seq_lens_cpu``, ``positions``, ``out_cache_loc``), checks the
logits rows (one per request, ``next_token_logits``), and for a forward where some row is NaN/±inf
writes one JSON line: the forward, every request in it (id, positions, tokens read, KV slots
written) and which failed — what ``run.requests``/``run.evict`` are made from. The replay of a
request alone needs the engine's own runner and is not done inside SGLang.

Tested against this documented signature only: SGLang does not install on the CPU machine this
was written on, so it has not run inside the engine.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import torch

from ..serving.packed import PackedRequest, PackedStep, failing_forward

log = logging.getLogger("nan_hunter")


def _ints(t: Any) -> list[int]:
    if t is None:
        return []
    return [int(v) for v in (t.reshape(-1).tolist() if isinstance(t, torch.Tensor) else t)]


def forward_batch_step(fb: Any) -> PackedStep:
    """The requests of an SGLang ``ForwardBatch``, in its order: an extend (prefill) forward packs
    ``extend_seq_lens`` tokens per request, a decode forward one each. KV "blocks" are the token
    slots written (``out_cache_loc``: SGLang's KV pool indexes tokens)."""
    n = int(fb.batch_size)
    lens = _ints(getattr(fb, "extend_seq_lens_cpu", None)) or _ints(getattr(fb, "extend_seq_lens", None))
    if len(lens) != n:
        lens = [1] * n  # decode: one token per request
    rids = list(getattr(fb, "rids", None) or [])
    slots = _ints(getattr(fb, "req_pool_indices", None))
    ids, pos, loc = _ints(fb.input_ids), _ints(getattr(fb, "positions", None)), _ints(fb.out_cache_loc)
    step = PackedStep()
    start = 0
    for i, k in enumerate(lens):
        rid = str(rids[i]) if i < len(rids) else f"slot {slots[i]}" if i < len(slots) else f"request {i}"
        step.requests.append(
            PackedRequest(
                rid,
                start,
                start + k,
                pos[start : start + k],
                ids[start : start + k],
                sorted(set(loc[start : start + k])),
            )
        )
        start += k
    step.kept_rows = [r.stop - 1 for r in step.requests]  # next_token_logits: each request's last row
    return step


class ForwardSentinel:
    """What the hook keeps: the forward count and the failing forwards, as JSON-ready dicts."""

    def __init__(self, log_path: str | None = None) -> None:
        self.log_path = log_path
        self.forwards = 0
        self.failures: list[dict[str, Any]] = []

    def __call__(self, module: Any, inputs: tuple, output: Any) -> None:
        self.forwards += 1
        logits = getattr(output, "next_token_logits", output)
        fb = inputs[2] if len(inputs) > 2 else None
        if not isinstance(logits, torch.Tensor) or fb is None or logits.dim() != 2:
            return None
        bad = (~torch.isfinite(logits).all(dim=-1)).nonzero().reshape(-1).tolist()
        if not bad:
            return None
        step = forward_batch_step(fb)
        failed = [step.requests[i].id for i in bad if i < len(step.requests)]
        entry = failing_forward(self.forwards - 1, step, failed)
        self.failures.append(entry)
        log.warning("nanhunter: forward %d: non-finite logits for request(s) %s", entry["forward"], failed)
        if self.log_path:
            with open(self.log_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")
        return None  # the output is left as it is


def hook_factory(config: dict[str, Any]) -> ForwardSentinel:
    """SGLang's ``hook_factory(config)``: ``config["log"]`` is a JSON-lines file for failing forwards."""
    path = config.get("log") if isinstance(config, dict) else None
    if path is not None and not isinstance(path, str):
        raise ValueError(f"nanhunter's SGLang hook: config['log'] must be a path, got {type(path).__name__}")
    return ForwardSentinel(path)
