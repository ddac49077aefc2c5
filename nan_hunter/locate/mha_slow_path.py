"""``nn.MultiheadAttention``'s fast path is one fused op (``aten._native_multi_head_attention``):
a NaN located there names no cause. Re-running the module with the fast path disabled takes the
slow path (in-projection, scores, softmax, out-projection as separate ops), where the op that
made it — e.g. a softmax over a fully masked row — can be named and diagnosed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

FUSED = "_native_multi_head_attention"


@contextlib.contextmanager
def fast_path_disabled() -> Iterator[None]:
    import torch

    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(prev)


def through_slow_path(
    located: tuple[Any, Any, tuple[Any, ...], dict[str, Any]],
    locate: Callable[[], tuple[Any, Any, tuple[Any, ...], dict[str, Any]]],
    notes: list[str],
) -> tuple[Any, Any, tuple[Any, ...], dict[str, Any]]:
    """``located`` (op event, module, args, kwargs) as it is, unless its op is the fused MHA op:
    then ``locate()`` again with the fast path disabled, and that answer when it names another op
    (saying so in ``notes``)."""
    ev = located[0]
    if ev is None or FUSED not in (ev.op or ""):
        return located
    with fast_path_disabled():
        slow = locate()
    if slow[0] is None or FUSED in (slow[0].op or ""):
        return located
    notes.append(
        f"nn.MultiheadAttention ran its fused fast path ({ev.op}); re-run with "
        f"torch.backends.mha.set_fastpath_enabled(False), its slow path names the op: {slow[0].op}"
    )
    return slow
