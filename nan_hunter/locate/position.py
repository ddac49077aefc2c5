"""Which token row holds a fault: the batch row and the position in that input's own tokens.

A module's output of shape (batch, seq, ...) is searched for its first non-finite element; its
sequence index becomes a position through what the root forward was called with. Every
transformers version passes one of these to the model's forward, and they are read in this order
(docs/compat.md):

1. ``position_ids`` ([batch or 1, seq]): each token's position in its own row, left padding already
   counted out (transformers 5.x ``generate()`` passes only these and a ``cache`` object; 4.x
   passes them for most decoder models too). Read as it is: no padding is subtracted.
2. ``cache_position`` ([seq]): absolute positions in the padded batch (transformers 4.38 - 5.2x
   while decoding), minus the row's left padding (the zeros leading its ``attention_mask``).
3. the KV cache's length (``past_key_values`` or ``cache`` with ``get_seq_length()``) plus the
   sequence index, minus the left padding.
4. no cache at all: the sequence index minus the left padding (a plain forward).

A cache this code cannot read gives no position: ``None`` with a note naming the library version,
never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..tree import float_tensors


@dataclass(frozen=True)
class TokenPosition:
    """Where a fault sits in the token sequence."""

    row: int  # batch row of the first non-finite element
    position: int | None  # in that row's own tokens (padding excluded); None: no sequence dim, or unknown
    source: str | None = (
        None  # what it was derived from: position_ids, cache_position, cache_length, no_cache
    )
    note: str | None = None  # why ``position`` is None when the output has a sequence dimension


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


def _cache(kwargs: dict[str, Any]) -> Any:
    for key in ("past_key_values", "cache", "past_key_value"):
        c = kwargs.get(key)
        if c is not None:
            return c
    return None


def _cache_length(cache: Any) -> int | None:
    """Tokens already in ``cache`` (None: a cache whose length this code cannot read)."""
    get = getattr(cache, "get_seq_length", None)
    if callable(get):
        try:
            return int(get())
        except Exception:  # noqa: BLE001 - a cache this code does not know
            return None
    if (
        isinstance(cache, (tuple, list))
        and cache
        and isinstance(cache[0], (tuple, list))
        and cache[0]
        and isinstance(cache[0][0], torch.Tensor)
        and cache[0][0].dim() == 4
    ):
        return int(cache[0][0].shape[-2])  # the legacy tuple format: (batch, heads, seq, dim)
    return None


def _left_pad(kwargs: dict[str, Any], row: int) -> int:
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and row < mask.shape[0]:
        ones = mask[row].nonzero()
        return int(ones[0]) if ones.numel() else 0
    return 0


def _library() -> str:
    try:
        import transformers

        return f"transformers {transformers.__version__}"
    except Exception:  # noqa: BLE001
        return "this transformers version"


def position_of(row: int, col: int, kwargs: dict[str, Any]) -> TokenPosition:
    """The position of sequence index ``col`` of batch row ``row`` in a forward called with ``kwargs``."""
    pid = kwargs.get("position_ids")
    if isinstance(pid, torch.Tensor) and pid.dim() == 2 and pid.shape[-1] > col:
        return TokenPosition(row, int(pid[row if pid.shape[0] > row else 0, col]), "position_ids")
    if isinstance(pid, torch.Tensor) and pid.dim() == 1 and pid.shape[0] > col:
        return TokenPosition(row, int(pid[col]) - _left_pad(kwargs, row), "position_ids")
    cp = kwargs.get("cache_position")
    if isinstance(cp, torch.Tensor) and cp.numel() > col:
        return TokenPosition(row, int(cp.reshape(-1)[col]) - _left_pad(kwargs, row), "cache_position")
    cache = _cache(kwargs)
    if cache is None:
        return TokenPosition(row, col - _left_pad(kwargs, row), "no_cache")
    n = _cache_length(cache)
    if n is None:
        return TokenPosition(
            row,
            None,
            None,
            f"the fault's token position is not known: {_library()} passed a "
            f"{type(cache).__name__} without position_ids or cache_position, and "
            "its length could not be read",
        )
    return TokenPosition(row, n + col - _left_pad(kwargs, row), "cache_length")


def token_position(out: Any, root_kwargs: dict[str, Any]) -> TokenPosition:
    """Row and position of the first fault in ``out`` (a module output of the forward called with
    ``root_kwargs``); position None when the output has no sequence dimension (no note then)."""
    hit = first_fault(out)
    if hit is None:
        return TokenPosition(0, None)
    row, col = hit
    if col is None:
        return TokenPosition(row, None)
    return position_of(row, col, root_kwargs)
