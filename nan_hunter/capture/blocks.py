"""The repeated blocks of a model (the residual stream): what level "blocks" watches."""

from __future__ import annotations

from torch import nn


def main_blocks(model: nn.Module) -> list[str]:
    """Dotted names of the repeated children of the model's largest ModuleList (the layers)."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) > 0:
            types = {type(c) for c in m}
            if len(types) != 1:
                continue
            size = sum(p.numel() for p in m.parameters())
            if best is None or size > best[0]:
                best = (size, name, m)
    if best is None:
        return []
    _, name, ml = best
    return [f"{name}.{i}" if name else str(i) for i in range(len(ml))]
