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
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ..capture.ops import OperandStats, OpEvent
from ..distributed.global_report import diagnosis_from_json
from ..distributed.ranks import RankSplit, agree, share
from ..explain.assemble import explain
from ..locate.located import Located
from ..report import FirstNonfinite, module_rows_from_json, replay_from_json, replay_json, rows_json
from .harness import locate_first, record, run_mode
from .protocol import ModeRun, fill

if TYPE_CHECKING:  # pragma: no cover
    from ..model.prepare import Prepared
    from ..report import Report
    from .protocol import Mode

# --- the split run --------------------------------------------------------------------------------


def run_mode_on_ranks(
    p: Prepared,
    mode: Mode,
    rep: Report,
    replay: bool = True,
    split: RankSplit | None = None,
    trace: Any = None,
) -> None:
    """The harness (``modes.harness.run_mode``), or with ``split`` (the CLI under torchrun, more than
    one rank) the harness with the data set split across ranks (``run_split``; ``--trace`` is
    refused under torchrun, so ``trace`` is the single process's)."""

    if split is None or split.world <= 1:
        run_mode(p, mode, rep, replay, trace)
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
    got = agree(
        {
            "failed": rec.failed,
            "modules": rows_json(rec.table),
            "masks": rec.notes,
            "first": rec.first_input,
            "absorbed": rec.absorbed,
            "extra": rec.extra,
        }
    )
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
            explain(
                loc,
                p.cfg,
                failed,
                len(p.batches),
                (rep.weights or {}).get("nonfinite") or [],
                replay,
                device=str(p.device),
                rank=split.rank,
            )
            sent = {
                "first": asdict(loc.first),
                "replay": replay_json(loc.replay),
                "is_block": loc.is_block,
                "diagnosis": asdict(loc.diagnosis) if loc.diagnosis is not None else None,
                "input_label": loc.input_label,
                "optimizer_facts": loc.optimizer_facts,
                "notes": loc.notes,
                "extra": loc.extra,
                "event": _event(loc.event),
            }
        found = agree(sent)[holder]
        located = Located(
            FirstNonfinite(**{**found["first"], "rank": holder}),
            p.run,
            _event_back(found["event"]),
            replay=replay_from_json(found["replay"]),
            is_block=found["is_block"],
            input_label=found["input_label"],
            optimizer_facts=found["optimizer_facts"],
            notes=found["notes"],
            extra=found["extra"],
            diagnosis=diagnosis_from_json(found["diagnosis"]),
        )
    if mode.one_step_table:  # the failing step's rows, as one process shows them (else the last input's)
        table = (
            got[min(firsts)[1]]["modules"]
            if firsts
            else next((g["modules"] for g in reversed(got) if g["modules"]), [])
        )
    else:
        table = [row for g in got for row in g["modules"]]
    merged = ModeRun(
        located.first.input_index if located else None,
        sorted({i for g in got for i in g["failed"]}),
        module_rows_from_json(table),
        [],
        [m for g in got for m in g["absorbed"]],
        mode.merge([g["extra"] for g in got]),
    )
    for note in (n for g in got for n in g["masks"]):
        if note not in merged.notes:
            merged.notes.append(note)
    rep.notes.append(
        f"split across {split.world} ranks: "
        + ", ".join(
            f"rank {r} ran {_span(share(len(p.batches), r, split.world))}" for r in range(split.world)
        )
    )
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
