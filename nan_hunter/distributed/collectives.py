"""torch.distributed basics shared by the collective ``report()`` and the rank-split CLI.

Nothing here pickles: objects cross ranks as JSON bytes in uint8 tensors (``all_gather_json``),
so a rank never unpickles what another sent. Every function is a no-op (one process, rank 0,
world 1) when no process group is initialised.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def active() -> bool:
    """Whether a process group is initialised with more than one rank (never when this process has not
    imported torch.distributed: a weights-only run does not load torch to ask)."""
    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    if not active():
        return 0
    import torch.distributed as dist

    return dist.get_rank()


def world() -> int:
    if not active():
        return 1
    import torch.distributed as dist

    return dist.get_world_size()


def _device() -> Any:
    """Where this backend wants collective tensors (gloo: CPU; nccl: this rank's GPU)."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend()).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_json(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (JSON-serialisable), indexed by rank, on every rank."""
    if not active():
        return [obj]
    import torch
    import torch.distributed as dist

    dev = _device()
    data = json.dumps(obj, allow_nan=True).encode()
    n = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    sizes = [torch.zeros_like(n) for _ in range(world())]
    dist.all_gather(sizes, n)
    longest = int(max(int(s) for s in sizes))
    buf = torch.zeros(longest, dtype=torch.uint8, device=dev)
    if data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    bufs = [torch.zeros_like(buf) for _ in range(world())]
    dist.all_gather(bufs, buf)
    return [json.loads(bytes(b[: int(s)].cpu().tolist()).decode()) for b, s in zip(bufs, sizes)]


def broadcast_json(obj: Any, src: int) -> Any:
    """``obj`` as rank ``src`` has it, on every rank."""
    if not active():
        return obj
    return all_gather_json(obj if rank() == src else None)[src]


def barrier() -> None:
    if active():
        import torch.distributed as dist

        dist.barrier()
