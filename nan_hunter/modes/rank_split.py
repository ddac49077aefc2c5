"""Data sets split across ranks: ``torchrun --nproc-per-node K -m nan_hunter scan|check ...``.

Launched by torchrun (``WORLD_SIZE`` > 1 with ``RANK``, ``LOCAL_RANK`` and ``MASTER_ADDR`` set),
the CLI opens a process group of its own (gloo on CPU, nccl when ``--device`` resolves to cuda)
and every rank builds the same model and data set, then runs only its share of the inputs: a
contiguous block, so rank order is data-set order. What each rank found crosses ranks as JSON
(``dist.all_gather_json``, never pickle) and every rank merges it into the report a single
process would write: ``failed_inputs`` are data-set indices, the modules table is the ranks'
tables in data-set order, and the first failing input (the lowest data-set index, as the
producer rule orders by input) is located, replayed and diagnosed by the rank that holds it,
which sends the result to the others; ``first_nonfinite.rank`` names that rank.

Errors are agreed collectively: every exchange is an ``agree`` (an all_gather that raises on every
rank when any rank sent an error), and a rank that fails between exchanges sends its error at
the exchange the others are waiting in. So a bad input on one rank ends every rank with exit 2
and the same one line, never a hang. Rank 0 alone writes and prints; the last exchange (the
exit code) comes after it wrote.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..capture.ops import OperandStats, OpEvent
from ..distributed import collectives as dist
from ..distributed.global_report import diagnosis_from_json
from ..errors import BadInput
from ..explain.assemble import explain
from ..locate.located import Located
from ..model.execute import resolve_device
from ..report import FirstNonfinite
from .harness import locate_first, record, run_mode
from .recording import ModeRun, fill

if TYPE_CHECKING:  # pragma: no cover
    from ..model.prepare import Prepared
    from ..report import Report
    from .recording import Mode

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

    import torch
    import torch.distributed as td


    dev = resolve_device(device)  # the same answer on every rank: a bad value fails everywhere alike
    owned = not td.is_initialized()  # called inside a program that opened its own group: use that one
    if owned:
        if dev.type == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        td.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                              timeout=datetime.timedelta(seconds=TIMEOUT_S))
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


# --- the split run --------------------------------------------------------------------------------


def run_mode_on_ranks(p: Prepared, mode: Mode, rep: Report, replay: bool = True, split: RankSplit | None = None
                      ) -> None:
    """The harness (``modes.harness.run_mode``), or with ``split`` (the CLI under torchrun, more than
    one rank) the harness with the data set split across ranks (``run_split``)."""

    if split is None or split.world <= 1:
        run_mode(p, mode, rep, replay)
        return
    mode.check(p)
    run_split(p, mode, rep, replay, split)


def run_split(p: Prepared, mode: Mode, rep: Report, replay: bool, split: RankSplit) -> None:
    """The harness with the data set split across ranks: each rank records its share (a
    contiguous block, so rank order is data-set order); what each found crosses ranks as JSON; the
    rank holding the first fault (the lowest data-set index) locates it and sends the result;
    every rank fills the same report as one process would."""

    mine = split.share(len(p.batches))
    rec = record(p, mode, mine) if mine else ModeRun(None, [], [])
    got = agree({"failed": rec.failed, "modules": rec.table, "masks": rec.notes, "first": rec.first_input,
                 "absorbed": rec.absorbed, "extra": rec.extra})
    firsts = [(g["first"], r) for r, g in enumerate(got) if g["first"] is not None]
    located = None
    if firsts:
        index, holder = min(firsts)
        sent: dict[str, Any] = {}
        if split.rank == holder:
            assert rec.capture is not None
            loc = locate_first(p, mode, rec.capture)
            failed = sorted({i for g in got for i in g["failed"]})
            # replayed, diagnosed and its fix verified here, where the failing region is
            explain(loc, p.cfg, failed, len(p.batches), (rep.weights or {}).get("nonfinite") or [], replay,
                    device=str(p.device), rank=split.rank)
            sent = {"first": asdict(loc.first), "replay": loc.replay, "is_block": loc.is_block,
                    "diagnosis": asdict(loc.diagnosis) if loc.diagnosis is not None else None,
                    "input_label": loc.input_label, "optimizer_facts": loc.optimizer_facts,
                    "notes": loc.notes, "extra": loc.extra, "event": _event(loc.event)}
        found = agree(sent)[holder]
        located = Located(FirstNonfinite(**{**found["first"], "rank": holder}), p.run, _event_back(found["event"]),
                          replay=found["replay"], is_block=found["is_block"], input_label=found["input_label"],
                          optimizer_facts=found["optimizer_facts"], notes=found["notes"], extra=found["extra"],
                          diagnosis=diagnosis_from_json(found["diagnosis"]))
    if mode.one_step_table:  # the failing step's rows, as one process shows them (else the last input's)
        table = got[min(firsts)[1]]["modules"] if firsts else next((g["modules"] for g in reversed(got)
                                                                    if g["modules"]), [])
    else:
        table = [row for g in got for row in g["modules"]]
    merged = ModeRun(located.first.input_index if located else None, sorted({i for g in got for i in g["failed"]}),
                     table, [], [m for g in got for m in g["absorbed"]], mode.merge([g["extra"] for g in got]))
    for note in (n for g in got for n in g["masks"]):
        if note not in merged.notes:
            merged.notes.append(note)
    rep.notes.append(f"split across {split.world} ranks: "
                     + ", ".join(f"rank {r} ran {_span(share(len(p.batches), r, split.world))}"
                                 for r in range(split.world)))
    fill(p, mode, rep, merged, located, replay)


def _event(ev: Any) -> dict[str, Any] | None:
    """An op event as JSON (operands as plain dicts), to cross ranks."""
    return asdict(dataclasses.replace(ev, call=None)) if ev is not None else None


def _event_back(d: dict[str, Any] | None) -> Any:

    if d is None:
        return None
    d = dict(d)
    d["operands"] = [OperandStats(**o) for o in d.get("operands") or []]
    return OpEvent(**d)


def _span(idx: list[int]) -> str:
    if not idx:
        return "no inputs"
    return f"input #{idx[0]}" if len(idx) == 1 else f"inputs #{idx[0]}-#{idx[-1]}"
