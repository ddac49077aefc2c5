"""A packed forward read from its own bookkeeping: which request owns which row.

Continuous batching (transformers' ``ContinuousBatchingManager``, what ``generate_batch`` runs)
packs every scheduled request into one ``[1, T]`` row: ``cu_seq_lens_q`` cuts it into requests,
``position_ids`` gives each token its place in its own sequence, ``write_index`` the physical
cache slots its keys and values go to, and the paged cache's block tables say which request owns
each block. ``packed_step`` reads these from a root forward's keywords (nothing is run), and
``failed_rows`` says which rows of its logits are non-finite. Pure bookkeeping: no hooks here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class PackedRequest:
    """One request's share of a packed forward."""

    id: str
    start: int  # its first row in the packed forward
    stop: int  # one past its last row
    positions: list[int]  # each row's position in its own sequence
    tokens: list[int]  # the token each row read
    blocks: list[int]  # the KV blocks its rows were written to (every attention group's block ids)


@dataclass
class PackedStep:
    """A packed forward's requests, in packed order."""

    requests: list[PackedRequest] = field(default_factory=list)
    kept_rows: list[int] | None = None  # the packed row of each logits row, when the model kept only those

    def packed_row(self, logits_row: int) -> int:
        """The packed row a row of the forward's logits belongs to."""
        return self.kept_rows[logits_row] if self.kept_rows is not None else logits_row

    def owner(self, row: int) -> PackedRequest | None:
        return next((r for r in self.requests if r.start <= row < r.stop), None)

    def rows(self, ids: set[str]) -> list[int]:
        return [i for r in self.requests if r.id in ids for i in range(r.start, r.stop)]


def failing_forward(forward: int, step: PackedStep, failed: list[str]) -> dict[str, Any]:
    """One engine hook's line for a forward with non-finite rows (SGLang's and vLLM's, the same
    shape): the forward's index, the failing requests, and every request of the forward with the
    positions and tokens it read and the KV slots it wrote — what ``run.requests``/``run.evict``
    are made from."""
    return {
        "forward": forward,
        "failed": failed,
        "requests": [
            {"id": r.id, "positions": r.positions, "tokens": r.tokens, "kv_slots": r.blocks}
            for r in step.requests
        ],
    }


def is_packed(kwargs: dict[str, Any]) -> bool:
    """Whether a root forward's keywords are a continuous-batching packed batch (a paged cache with
    ``cu_seq_lens_q`` and ``logits_indices``)."""
    if "logits_indices" not in kwargs:  # first: one lookup answers for every other forward
        return False
    cache = kwargs.get("cache")
    return cache is not None and hasattr(cache, "cache_allocators") and "cu_seq_lens_q" in kwargs


def _ints(t: Any) -> list[int]:
    return [int(v) for v in (t.reshape(-1).tolist() if isinstance(t, torch.Tensor) else t)]


def packed_step(kwargs: dict[str, Any]) -> PackedStep | None:
    """The requests of a packed forward from its keywords, or None when it is not one. A row's
    request is the owner of the block its write slot falls in (blocks being written belong to one
    request; shared prefix blocks are complete and never written)."""
    if not is_packed(kwargs):
        return None
    cache = kwargs["cache"]
    cu = _ints(kwargs["cu_seq_lens_q"])
    ids = _ints(kwargs["input_ids"])
    pos = _ints(kwargs["position_ids"])
    writes = kwargs.get("write_index") or []
    allocators = list(cache.cache_allocators.values())
    slots = [_ints(w) for w in writes]
    owners: list[dict[int, str]] = [
        {b: rid for rid, table in a.block_table.items() for b in table} for a in allocators
    ]
    keep = kwargs.get("logits_to_keep")
    step = PackedStep(kept_rows=_ints(keep) if isinstance(keep, torch.Tensor) else None)
    for s, e in zip(cu, cu[1:]):
        if e <= s or e > len(ids):
            continue  # a padding sequence (static shapes)
        rid = None
        blocks: set[int] = set()
        for a, own, w in zip(allocators, owners, slots):
            if len(w) < e:
                continue
            stride = a.block_physical_stride
            for slot in w[s:e]:
                b = slot // stride
                blocks.add(b)
                rid = rid or own.get(b)
        if rid is None:
            rid = f"rows {s}-{e - 1}"  # no block table names it (a write to the trash sector)
        step.requests.append(PackedRequest(rid, s, e, pos[s:e], ids[s:e], sorted(blocks)))
    return step


def logits_of(output: Any) -> torch.Tensor | None:
    """The logits of a causal LM's output (``.logits``, or the first tensor of a tuple)."""
    t = getattr(output, "logits", None)
    if t is None and isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        t = output[0]
    return t if isinstance(t, torch.Tensor) and t.dim() == 3 else None


def failed_rows(logits: torch.Tensor) -> list[int]:
    """Rows of a packed ``[1, T, vocab]`` logits tensor holding a NaN or ±inf."""
    with torch.no_grad():
        bad = ~torch.isfinite(logits[0]).all(dim=-1)
    return [int(i) for i in bad.nonzero().reshape(-1).tolist()]
