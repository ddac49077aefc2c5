"""``scale``: scales that are not a weight's: activation (``input_scale``, ``output_scale``), KV cache and
attention (``k_scale``, ``v_scale``, ``q_scale``, ``prob_scale``, ``kv_scale``) and global scales
(``*_global_scale``, modelopt's ``weight_scale_2``) that no weight format consumed. Each element is judged:
NaN, Inf, zero or negative is ``bad_scale`` (an activation divided or multiplied by it is lost).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from .base import Blocks, Context, QuantizedWeight, scale_values

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint

SUFFIXES = (
    ".input_scale",
    ".output_scale",
    ".k_scale",
    ".v_scale",
    ".q_scale",
    ".prob_scale",
    ".kv_scale",
    "_global_scale",
    ".weight_scale_2",
)
TAGS = ("F64", "F32", "F16", "BF16", "F8_E8M0", "F8_E4M3", "F8_E5M2")


class StandaloneScales:
    name = "scale"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        found = []
        for n in sorted(x for x in ctx.names if x.endswith(SUFFIXES) and ctx.free(x)):
            if ctx.tag(n) not in TAGS:
                continue
            ctx.claim(n)
            if math.prod(ctx.shape(n)):
                found.append(QuantizedWeight(n, "scale", n, self, list(ctx.shape(n))))
        return found

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:
        v = scale_values(ck, q.scale)
        return Blocks(
            v,
            list(q.layout),
            1.0,
            None,
            0,
            0,
            negative_is_fault=True,
            zero_is_fault=True,
            known=np.ones(v.size, dtype=np.float32),
            sizes=1,
        )

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:
        return iter(())  # no data besides the scale itself
