"""vLLM: a general plugin (and an ``LLM.apply_model`` function) that keeps the per-request sentinel
of every forward.

Two ways in, both through vLLM's documented surface:

* **the plugin** — nanhunter declares ``nanhunter = nan_hunter.integrations.vllm:register`` in the
  ``vllm.general_plugins`` entry-point group; vLLM's ``load_general_plugins()`` calls ``register()``
  in every process it starts, before any work (it may call it more than once: it is idempotent).
  It does nothing unless ``NANHUNTER_VLLM_LOG`` names a JSON-lines file: a plugin is loaded for
  every vLLM user who has nanhunter installed, so it is opt-in (``VLLM_PLUGINS`` can also exclude
  it). With the variable set, it installs a one-shot global forward pre-hook that attaches the
  sentinel to the first vLLM model that runs (a module with ``compute_logits``: vLLM's text
  generation interface; the profile run at start-up is its first forward) and removes itself;
* **in-process** — ``llm.apply_model(functools.partial(attach, log=PATH))`` (vLLM's
  ``LLM.apply_model`` runs a function on the model inside each worker).

The sentinel is a forward hook on the root model, called as ``model(input_ids=..., positions=...,
intermediate_tensors=..., inputs_embeds=...)`` and returning the hidden states, one row per
scheduled token. Per forward: one ``isfinite(...).all()`` and one read-back. When a row is NaN/±inf,
the forward's packing is read from vLLM's forward context (``get_forward_context()``: its attention
metadata's ``query_start_loc`` — where each request's tokens start — and ``slot_mapping``, the
KV-cache slot each token wrote) and one JSON line is written, as the SGLang hook does (``serving.packed``): the
forward, every request in it (positions, tokens read, KV slots written) and which failed. vLLM's
model does not know its requests' ids: a request is named by its row in the batch (``row 2``),
unless ``attach`` was given ``request_ids`` (a callable returning the batch's ids, in order).

Not run inside a vLLM engine: vLLM does not install on the CPU-only machine this was written on.
vLLM 0.33.0's own ``load_general_plugins()`` (its source from the wheel, not installed) was run
once against this entry point and installed the one-shot hook; the rest is tested against the
documented plugin contract, ``apply_model``'s function-of-the-model, the model call signature
and the forward context's fields (``tests/unit/integrations/test_vllm.py``). Under full
CUDA graphs the model's Python forward is replayed without its hooks: run with ``--enforce-eager``
or piecewise graphs (the root model stays eager there).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from ..serving.packed import PackedRequest, PackedStep, failing_forward

log = logging.getLogger("nan_hunter")

ENV_LOG = "NANHUNTER_VLLM_LOG"
_ATTACHED = "_nanhunter_vllm_sentinel"
_registered: list[Any] = []  # the one-shot global pre-hook's handle, while it waits for a model


def _ints(t: Any) -> list[int]:
    if t is None:
        return []
    return [int(v) for v in (t.reshape(-1).tolist() if isinstance(t, torch.Tensor) else t)]


def _first(obj: Any, has: Callable[[Any], bool]) -> Any:
    """The first value in ``obj`` (a dict layer name -> value, or a list of such dicts under
    micro-batching, as vLLM's forward context holds them) for which ``has`` holds, else None."""
    todo = [obj]
    while todo:
        m = todo.pop(0)
        if isinstance(m, dict):
            todo += list(m.values())
        elif isinstance(m, (list, tuple)):
            todo += list(m)
        elif m is not None and has(m):
            return m
    return None


def packing(ctx: Any) -> tuple[Any, Any]:
    """(query_start_loc, slot_mapping) of the running forward from vLLM's forward context: the
    attention metadata's ``query_start_loc``; the slots from the context's ``slot_mapping`` (vLLM
    ≥ 0.11: a dict layer name -> tensor) or, before, the metadata's own. (None, None) without one."""
    md = _first(
        getattr(ctx, "attn_metadata", None), lambda m: getattr(m, "query_start_loc", None) is not None
    )
    if md is None:
        return None, None
    slots = _first(getattr(ctx, "slot_mapping", None), lambda t: isinstance(t, torch.Tensor))
    return md.query_start_loc, slots if slots is not None else getattr(md, "slot_mapping", None)


def vllm_context() -> Any:
    """vLLM's forward context of the running forward, or None outside one (or without vLLM)."""
    try:
        from vllm.forward_context import get_forward_context, is_forward_context_available
    except ImportError:
        return None
    return get_forward_context() if is_forward_context_available() else None


def forward_step(
    input_ids: Any,
    positions: Any,
    query_start_loc: Any,
    slot_mapping: Any = None,
    ids: list[str] | None = None,
) -> PackedStep:
    """The requests of one vLLM forward: request ``i`` owns token rows ``query_start_loc[i] ..
    query_start_loc[i+1]``; its KV "blocks" are the slots those tokens wrote (``slot_mapping``:
    vLLM's cache indexes slots, ``block = slot // block_size``). Without ``query_start_loc`` the
    whole forward is one entry, ``batch``."""
    toks, pos = _ints(input_ids), _ints(positions)
    if query_start_loc is None:
        return PackedStep([PackedRequest("batch", 0, len(toks), pos, toks, [])])
    starts, slots = _ints(query_start_loc), _ints(slot_mapping)
    step = PackedStep()
    for i in range(len(starts) - 1):
        a, b = starts[i], starts[i + 1]
        rid = str(ids[i]) if ids is not None and i < len(ids) else f"row {i}"
        step.requests.append(PackedRequest(rid, a, b, pos[a:b], toks[a:b], sorted(set(slots[a:b]))))
    step.kept_rows = [r.stop - 1 for r in step.requests]
    return step


class VllmSentinel:
    """The forward hook (``register_forward_hook(..., with_kwargs=True)`` on the root model): the
    forward count and the failing forwards, as JSON-ready dicts (``failures``)."""

    def __init__(
        self,
        log_path: str | None = None,
        context: Callable[[], Any] = vllm_context,
        request_ids: Callable[[], list[str]] | None = None,
    ) -> None:
        self.log_path = log_path
        self.context = context
        self.request_ids = request_ids
        self.forwards = 0
        self.failures: list[dict[str, Any]] = []

    def __call__(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        self.forwards += 1
        hidden = output[0] if isinstance(output, tuple) else output
        if not isinstance(hidden, torch.Tensor) or not hidden.is_floating_point() or hidden.dim() < 1:
            return None  # a pipeline stage's IntermediateTensors: judged by the last stage
        if bool(torch.isfinite(hidden).all()):  # the one read-back of a finite forward
            return None
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        starts, slots = packing(self.context())
        step = forward_step(
            input_ids, positions, starts, slots, self.request_ids() if self.request_ids is not None else None
        )
        rows = hidden.reshape(hidden.shape[0], -1) if hidden.dim() > 1 else hidden.reshape(-1, 1)
        bad = set((~torch.isfinite(rows).all(dim=-1)).nonzero().reshape(-1).tolist())
        failed = [r.id for r in step.requests if any(r.start <= i < r.stop for i in bad)]
        entry = failing_forward(self.forwards - 1, step, failed)
        self.failures.append(entry)
        log.warning(
            "nanhunter: vLLM forward %d: non-finite hidden states for request(s) %s", entry["forward"], failed
        )
        if self.log_path:
            with open(self.log_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")
        return None  # the output is left as it is


def attach(
    model: Any,
    log: str | None = None,
    request_ids: Callable[[], list[str]] | None = None,
    context: Callable[[], Any] = vllm_context,
) -> VllmSentinel:
    """Hook the sentinel on ``model`` (vLLM's root model); attaching twice keeps the first. For
    ``llm.apply_model(functools.partial(attach, log=PATH))``."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"nanhunter's vLLM sentinel needs the model (an nn.Module), got {type(model).__name__}"
        )
    held = getattr(model, _ATTACHED, None)
    if held is not None:
        return held
    sentinel = VllmSentinel(log, context, request_ids)
    model.register_forward_hook(sentinel, with_kwargs=True)
    object.__setattr__(model, _ATTACHED, sentinel)
    return sentinel


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point (module docstring): opt-in by ``NANHUNTER_VLLM_LOG``."""
    path = os.environ.get(ENV_LOG)
    if not path or _registered:
        return

    def first_model(module: Any, args: Any) -> None:
        if callable(getattr(module, "compute_logits", None)):
            for h in _registered:
                h.remove()
            attach(module, log=path)
            log.info(
                "nanhunter: vLLM sentinel attached to %s, failing forwards go to %s",
                type(module).__name__,
                path,
            )

    _registered.append(torch.nn.modules.module.register_module_forward_pre_hook(first_model))
