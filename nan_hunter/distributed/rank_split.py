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

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ..errors import BadInput
from . import collectives as dist

if TYPE_CHECKING:  # pragma: no cover
    from ..model.prepare import Prepared
    from ..report import Report

#: What torchrun sets in every worker's environment.
TORCHRUN_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR")
#: Seconds a rank waits in an exchange before the process group gives up (a peer that died).
TIMEOUT_S = float(os.environ.get("NANHUNTER_DIST_TIMEOUT", "1800"))

_splitting = False  # set while the CLI's process group is open: run_model then splits


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


def splitting() -> bool:
    """Whether the data set is being split across ranks (the CLI under torchrun)."""
    return _splitting and dist.active()


def writes() -> bool:
    """Whether this process prints and writes outputs (rank 0, or a single process)."""
    if dist.active():
        return dist.rank() == 0
    return not launched() or os.environ.get("RANK", "0") == "0"


def refuse_unsupported(args: Any) -> None:
    """Options not split across ranks yet: exit 2 on every rank before any work (deterministic)."""
    if not launched():
        return
    for attr, flag in (("generate", "--generate"), ("compile", "--compile"), ("device_map", "--device-map"),
                       ("backward", "--backward")):
        if getattr(args, attr, None):
            raise BadInput(f"{flag} is not supported under torchrun yet; run it in one process "
                           "(without torchrun)")


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
def process_group(device: str) -> Iterator[None]:
    """Under torchrun: open the process group for ``device`` (gloo on CPU, nccl on CUDA), split
    data sets while it is open, and close it at the end. Elsewhere: nothing."""
    global _splitting
    if not launched():
        yield
        return
    import datetime

    import torch
    import torch.distributed as td

    from ..model.execute import resolve_device

    dev = resolve_device(device)  # the same answer on every rank: a bad value fails everywhere alike
    owned = not td.is_initialized()  # called inside a program that opened its own group: use that one
    if owned:
        if dev.type == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        td.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                              timeout=datetime.timedelta(seconds=TIMEOUT_S))
    _splitting = True
    try:
        yield
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
        _splitting = False
        if owned:
            td.destroy_process_group()


def finish(code: int) -> int:
    """The last exchange, after rank 0 wrote its outputs: every rank returns rank 0's exit code."""
    if not dist.active():
        return code
    return int(agree({"code": code})[0]["code"])


# --- the split run --------------------------------------------------------------------------------


def run_model_split(p: Prepared, rep: Report, replay: bool, *, explain: Callable[..., Any],
                    near_misses: Callable[..., list[dict]], run_block: Callable[..., dict],
                    failed_note: Callable[..., None]) -> None:
    """``pipeline.run_model`` with the inputs split across ranks (the pipeline's own steps are
    passed in, so this module does not import it)."""
    from ..locate.producer import call_table, failed_inputs, first_finding, mask_notes
    from ..model.execute import capture_run, forward
    from ..report import Diagnosis, FirstNonfinite
    from ..report import Report as _Report

    me, world = dist.rank(), dist.world()
    mine = share(len(p.batches), me, world)
    w, finding = None, None
    local: dict[str, Any] = {"failed": [], "modules": [], "masks": [], "first": None}
    if mine:
        w = capture_run(p.model, [p.batches[i] for i in mine], "modules", p.run)
        for c in w.calls:
            c.input_index = mine[c.input_index]  # local forward number → data-set index
        rows = w.sink.rows()
        finding = first_finding(w.calls, rows)  # by input first: the lowest data-set index wins
        local = {"failed": failed_inputs(w.calls, rows), "modules": call_table(w.calls, rows),
                 "masks": mask_notes(w.calls, rows), "first": finding.call.input_index if finding else None}
    got = agree(local)
    failed = sorted({i for g in got for i in g["failed"]})
    rep.run = run_block(p, failed)
    rep.modules = [row for g in got for row in g["modules"]]
    for note in (n for g in got for n in g["masks"]):
        if note not in rep.notes:
            rep.notes.append(note)
    rep.inputs = [{"index": i, "label": lbl, "finite": i not in failed} for i, lbl in enumerate(p.labels)]
    rep.notes.append(f"split across {world} ranks: "
                     + ", ".join(f"rank {r} ran {_span(share(len(p.batches), r, world))}" for r in range(world)))
    firsts = [(g["first"], r) for r, g in enumerate(got) if g["first"] is not None]
    if not firsts:
        absorbed: list[dict] = []
        if p.cfg.near_miss.absorbed_intermediates and mine:
            ops = capture_run(p.model, [p.batches[i] for i in mine], "ops", p.run).op_records
            absorbed = near_misses([], p.run, p.cfg, ops)
        parts = agree({"absorbed": absorbed})
        rep.near_misses = near_misses(rep.modules, p.run, p.cfg, []) + [m for g in parts for m in g["absorbed"]]
        return
    index, holder = min(firsts)
    sent: dict[str, Any] = {}
    if me == holder:
        sub = _Report(checkpoint=rep.checkpoint, weights=rep.weights)
        kw = p.batches[index]
        explain(p, sub, finding, lambda: forward(p.model, kw, p.run), index, failed, replay=replay)
        sent = {"first_nonfinite": asdict(sub.first_nonfinite), "replay": sub.replay,
                "diagnosis": asdict(sub.diagnosis) if sub.diagnosis else None, "notes": sub.notes}
    found = agree(sent)[holder]
    rep.first_nonfinite = FirstNonfinite(**found["first_nonfinite"])
    rep.first_nonfinite.rank = holder
    rep.replay = found["replay"]
    rep.diagnosis = Diagnosis(**found["diagnosis"]) if found["diagnosis"] else None
    rep.notes += [n for n in found["notes"] if n not in rep.notes]
    failed_note(p, rep, failed)


def _span(idx: list[int]) -> str:
    if not idx:
        return "no inputs"
    return f"input #{idx[0]}" if len(idx) == 1 else f"inputs #{idx[0]}-#{idx[-1]}"
