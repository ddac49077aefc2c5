"""The sentinel's one question per phase: did any of these tensors go non-finite?

``watch(level="sentinel")`` hooks no module on a finite step. After backward it asks this of every
gradient, after ``optimizer.step()`` of every parameter and optimizer-state tensor: one fused
reduction (``torch._foreach_norm`` with ord ∞ on a GPU; on a CPU one ``aminmax`` per tensor, cheaper
there; both propagate NaN and ±inf and cannot overflow a finite value, unlike a sum or an L2 norm),
one device bool, and — only when that bool is read —
one read-back. Only the failing step pays for detail: its tensors are then measured one by one into
stats rows (``Recorder``), and ``report()`` replays the step in full.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..tree import local_shard

_INF = float("inf")


def float_tensors_of(tensors: Any) -> list[torch.Tensor]:
    """The floating, non-empty, non-meta tensors among ``tensors``, detached, as this rank holds
    them (a DTensor's local shard: no collective)."""
    out = []
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.is_meta:
            continue
        t = local_shard(t.detach())
        if t.numel():
            out.append(t)
    return out


def nonfinite_flag(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """A bool tensor on the tensors' device, True when any element of any tensor is NaN or ±inf;
    None when there is nothing to judge. No host synchronisation: the caller reads it once."""
    if not tensors:
        return None
    with torch.no_grad():
        if tensors[0].device.type == "cpu":
            return _extremes(tensors).isfinite().all().logical_not()
        norms: tuple[torch.Tensor, ...] | list[torch.Tensor] = torch._foreach_norm(tensors, _INF)
        device = tensors[0].device
        if any(n.device != device for n in norms):  # a model across devices: gathered for one read
            norms = [n.to(device) for n in norms]
        return torch.stack(norms).isfinite().all().logical_not()  # stack promotes mixed dtypes


def _extremes(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Every tensor's min and max (NaN and ±inf propagate), stacked: on a CPU ``aminmax`` reads
    ~1.4 instructions an element where the ord-∞ norm takes ~13 (callgrind, MiniLM's parameters)."""
    ext: list[torch.Tensor] = []
    for t in tensors:
        if not t.numel():  # aminmax has no identity: an empty tensor has nothing to judge
            continue
        mn, mx = torch.aminmax(t.cpu() if t.device.type != "cpu" else t)
        ext += (mn, mx)
    return torch.stack(ext) if ext else torch.zeros(0)


def host_nonfinite(tensors: list[torch.Tensor]) -> bool:
    """``any_nonfinite`` for tensors a host reads at once (a CPU sink, per forward): one
    ``aminmax`` each, one read."""
    if len(tensors) == 1:
        if not tensors[0].numel():  # an empty output (a batch of none): nothing to judge
            return False
        mn, mx = torch.aminmax(tensors[0])
        return not (math.isfinite(mn.item()) and math.isfinite(mx.item()))
    tensors = [t for t in tensors if t.numel()]
    if not tensors:
        return False
    if any(t.device.type != "cpu" for t in tensors):
        return any_nonfinite(tensors)
    return not all(math.isfinite(v) for v in _extremes(tensors).tolist())


def any_nonfinite(tensors: list[torch.Tensor]) -> bool:
    """``nonfinite_flag`` read back (the one host read of a phase)."""
    flag = nonfinite_flag(tensors)
    return flag is not None and bool(flag)


def optimizer_state_tensors(
    optimizer: Any, params: list[torch.Tensor]
) -> list[list[tuple[str, torch.Tensor]]]:
    """Per parameter: its floating optimizer-state tensors (``exp_avg``, ``exp_avg_sq``...), labelled."""
    out = []
    for p in params:
        st = optimizer.state.get(p) or {}
        out.append(
            [
                (k, v)
                for k, v in st.items()
                if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0
            ]
        )
    return out
