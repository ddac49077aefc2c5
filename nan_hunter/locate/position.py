"""Which token row holds a fault: the batch row and the position in that input's own tokens.

A module's output of shape (batch, seq, ...) is searched for its first non-finite element; its
sequence index becomes a position through the root forward's arguments: ``cache_position`` (the
absolute positions of this forward's tokens, as transformers passes them while decoding) or the
KV cache's length, minus the row's left padding (the zeros that lead its ``attention_mask``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..tree import float_tensors


def first_fault(out: Any) -> tuple[int, int | None] | None:
    """(batch row, sequence index or None) of the first non-finite element of ``out``."""
    for _, t in float_tensors(out):
        bad = ~torch.isfinite(t.detach())
        if not bool(bad.any()):
            continue
        idx = bad.nonzero()[0].tolist()
        if t.dim() < 3:
            return (idx[0] if t.dim() == 2 else 0), None
        return idx[0], idx[1]
    return None


def _past_length(kwargs: dict[str, Any]) -> int:
    cache = kwargs.get("past_key_values")
    get = getattr(cache, "get_seq_length", None)
    try:
        return int(get()) if callable(get) else 0
    except Exception:  # noqa: BLE001 - a cache this code does not know: no offset
        return 0


def token_position(out: Any, root_kwargs: dict[str, Any]) -> tuple[int, int | None]:
    """(row, position) of the first fault in ``out`` (a module output of the forward called with
    ``root_kwargs``); position None when the output has no sequence dimension."""
    hit = first_fault(out)
    if hit is None:
        return 0, None
    row, col = hit
    if col is None:
        return row, None
    cp = root_kwargs.get("cache_position")
    absolute = int(cp.reshape(-1)[col]) if isinstance(cp, torch.Tensor) and cp.numel() > col else \
        _past_length(root_kwargs) + col
    mask = root_kwargs.get("attention_mask")
    pad = 0
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and row < mask.shape[0]:
        ones = mask[row].nonzero()
        pad = int(ones[0]) if ones.numel() else 0
    return row, absolute - pad
