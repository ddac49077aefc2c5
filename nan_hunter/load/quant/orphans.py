"""Integer, fp8 and fp4 layer weights that no format claimed: their scales were not found, so their
dequantized values cannot be judged. Listed in ``weights.unchecked`` (reason ``"scales not found"``),
never called clean; the plain scan still checks fp8 codes for NaN/Inf."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import FP8_TAGS, Blocks, Context, QuantizedWeight

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator

    import numpy as np

    from ..checkpoint import Checkpoint

WEIGHT_NAMES = (".weight", ".qweight", ".weight_packed", "_blocks")
CODE_TAGS = FP8_TAGS | {"F4", "F6_E2M3", "F6_E3M2", "I8", "U8", "I32", "I16", "U16", "U32"}


class ScalesNotFound:
    name = "scales_not_found"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        for n in sorted(x for x in ctx.names if x.endswith(WEIGHT_NAMES) and ctx.free(x)):
            tag = ctx.tag(n)
            if tag in CODE_TAGS and tag != "BOOL":
                ctx.skip(n, tag, "scales not found")
        return []

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:  # pragma: no cover - detect finds none
        raise AssertionError(q.name)

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:  # pragma: no cover
        raise AssertionError(q.name)
