"""torchrun's ranks as the commands see them, without importing torch until a group opens: whether
this process was launched by torchrun (``launched``), which rank writes (``writes``), each rank's share
of a data set (``share``, ``RankSplit``), the process group (``process_group``), the collective error
rule (``agree``: an error on any rank is raised on every rank) and the last exchange (``finish``).
The split run itself is ``modes/rank_split.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import BadInput
from . import collectives as dist

#: What torchrun sets in every worker's environment.
TORCHRUN_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR")
#: Seconds a rank waits in an exchange before the process group gives up (a peer that died).
TIMEOUT_S = float(os.environ.get("NANHUNTER_DIST_TIMEOUT", "1800"))


class AgreedBadInput(BadInput):
    """A bad input every rank already knows about (no further exchange needed)."""


class AgreedError(RuntimeError):
    """An internal error on some rank, known to every rank."""


def launched() -> bool:
    """Whether this process is one of several workers started by torchrun."""
    env = os.environ
    if not all(k in env for k in TORCHRUN_ENV):
        return False
    try:
        return int(env["WORLD_SIZE"]) > 1
    except ValueError:
        return False


@dataclass(frozen=True)
class RankSplit:
    """The CLI's data set split across torchrun ranks: what ``process_group`` yields, and what
    the harness is handed to split a run (``None``: one process)."""

    rank: int
    world: int

    def share(self, n: int) -> list[int]:
        """The data-set indices this rank runs, of ``n``."""
        return share(n, self.rank, self.world)


def writes() -> bool:
    """Whether this process prints and writes outputs (rank 0, or a single process)."""
    if dist.active():
        return dist.rank() == 0
    return not launched() or os.environ.get("RANK", "0") == "0"


def share(n: int, rank: int, world: int) -> list[int]:
    """The data-set indices rank ``rank`` of ``world`` runs: a contiguous block (sizes differ by 1 at most)."""
    return list(range(n * rank // world, n * (rank + 1) // world))


def _error_payload(e: BaseException) -> dict[str, Any]:
    if isinstance(e, BadInput):
        return {"error": str(e), "bad_input": True}
    msg = str(e).splitlines()[0] if str(e) else ""
    return {"error": f"{type(e).__name__}: {msg}", "bad_input": False}


def _raise_agreed(got: list[Any]) -> None:
    """Raise the lowest rank's error (the same line on every rank), if any rank sent one."""
    for r, g in enumerate(got):
        if isinstance(g, dict) and "error" in g:
            if g.get("bad_input"):
                raise AgreedBadInput(f"rank {r}: {g['error']}")
            raise AgreedError(f"rank {r}: {g['error']}")


def agree(payload: dict[str, Any]) -> list[Any]:
    """Every rank's ``payload``, by rank; raises on every rank when any rank sent an error."""
    got = dist.all_gather_json(payload)
    _raise_agreed(got)
    return got


@contextmanager
def process_group(device: str) -> Iterator[RankSplit | None]:
    """Under torchrun: open the process group for ``device`` (gloo on CPU, nccl on CUDA) and yield
    the ``RankSplit`` the commands hand to the harness; close the group at the end. Elsewhere:
    yield None."""
    if not launched():
        yield None
        return
    import datetime

    import torch  # lazy: torch only where a process group opens (a weights-only run never gets here)
    import torch.distributed as td

    from ..model.execute import resolve_device  # lazy: imports torch

    dev = resolve_device(device)  # the same answer on every rank: a bad value fails everywhere alike
    owned = not td.is_initialized()  # called inside a program that opened its own group: use that one
    if owned:
        if dev.type == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        td.init_process_group(
            "nccl" if dev.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S)
        )
    try:
        yield RankSplit(dist.rank(), dist.world())
    except (AgreedBadInput, AgreedError, KeyboardInterrupt):
        raise
    except Exception as e:
        # The others wait in their next exchange (at the latest the final one): tell them.
        try:
            got = dist.all_gather_json(_error_payload(e))
        except Exception:  # the group itself is broken (a rank died): this rank's own error stands
            raise e from None
        _raise_agreed(got)
        raise
    finally:
        if owned:
            td.destroy_process_group()


def finish(code: int) -> int:
    """The last exchange, after rank 0 wrote its outputs: every rank returns rank 0's exit code."""
    if not dist.active():
        return code
    return int(agree({"code": code})[0]["code"])
