"""A weight and its scale tensor, found by name: ``X.weight`` (or ``X.weight_packed``) with
``X.weight_scale_inv`` (DeepSeek-V3, transformers' finegrained fp8), ``X.weight_scale``
(compressed-tensors, modelopt, Quark), or ``X.scale`` (DeepSeek-V4's own checkpoints)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .base import Context

SUFFIXES = (".weight_scale_inv", ".weight_scale", ".scale")


@dataclass(frozen=True)
class Pair:
    data: str  # the tensor holding the codes
    scale: str
    prefix: str  # "X.weight"
    kind: str  # "scale_inv" | "weight_scale" | "scale"


def weight_scale_pairs(ctx: Context) -> Iterator[Pair]:
    """Every unclaimed ``(data, scale)`` pair, in name order."""
    for s in sorted(n for n in ctx.names if n.endswith(SUFFIXES) and n not in ctx.claimed):
        if s.endswith(".weight_scale_inv"):
            prefix, kind = s[: -len("_scale_inv")], "scale_inv"
        elif s.endswith(".weight_scale"):
            prefix, kind = s[: -len("_scale")], "weight_scale"
        else:
            prefix, kind = s[: -len(".scale")] + ".weight", "scale"
        data = prefix + "_packed" if ctx.free(prefix + "_packed") else prefix if ctx.free(prefix) else None
        if data is not None and ctx.free(s):
            yield Pair(data, s, prefix, kind)
