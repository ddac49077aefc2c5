"""A watch's report of continuous batching: ``run.requests`` and ``run.evict`` (contract v1.4,
"Serving: packed batches"), and which request the report's ``first_nonfinite`` is about.

Every request whose logits rows went non-finite is replayed alone from its own tokens
(``serving.alone``): one that still fails is an ``origin``; one that does not was poisoned through
the packed batch by the origin that failed in the same forward (``poisoned_by``). When the fault
sits in a weight every request reads (the recording's first finding is a parameter, or every
request seen fails alone), each request is an origin and the report says the weight is shared,
naming no single request as the culprit. The report's ``first_nonfinite``/``diagnosis`` are
located on the first origin run alone (``origin_rerun``).

A request's ``token.text`` is the token decoded by the tokenizer saved with the model's checkpoint
(``tokenizer_of``: a model loaded from a local Hugging Face directory holding one, with no remote
code); null when there is none — the watch is given a model, not a tokenizer.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..locate.judged_recording import Recording
from ..locate.rerun import Rerun
from ..model.build import TOKENIZER_FILES, custom_code
from ..report import Eviction, Report, RequestOutcome
from .alone import AloneRerun
from .tracker import PackedBatches, RequestTrace


def _failed(pb: PackedBatches) -> list[RequestTrace]:
    """Failing requests, by their first failing forward, then in packed order."""
    ts = [t for t in pb.requests.values() if t.first_forward is not None]
    order = {rid: i for i, rid in enumerate(pb.requests)}
    return sorted(ts, key=lambda t: (t.first_forward, _row(pb, t), order[t.id]))


def _row(pb: PackedBatches, t: RequestTrace) -> int:
    step = pb.steps.get(t.first_forward) if t.first_forward is not None else None
    r = next((r for r in step.requests if r.id == t.id), None) if step is not None else None
    return r.start if r is not None else 0


def _natural(rid: str) -> tuple:
    """``req_2`` before ``req_10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", rid))


def shared_weight(pb: PackedBatches, rec: Recording) -> bool:
    """Whether the fault is in a weight all requests read: the first finding is a parameter, or
    every request seen (two or more) fails alone and so does the first one's first token by itself
    (no input of its own to blame: a prompt that overflows fails on its own tokens, not on ``<s>``)."""
    f = rec.finding
    if f is not None and f.role == "weights":
        return True
    ts = list(pb.requests.values())
    if len(ts) < 2 or not all(t.first_forward is not None and pb.judge_alone(t) for t in ts):
        return False
    first = ts[0].tokens.get(0)
    return first is not None and bool(pb.fails_alone([first]))


def first_origin(pb: PackedBatches) -> RequestTrace | None:
    """The first failing request that still fails alone (else the first failing one)."""
    failed = _failed(pb)
    return next((t for t in failed if pb.judge_alone(t)), failed[0] if failed else None)


def origin_rerun(pb: PackedBatches, rec: Recording, base: Rerun) -> Rerun:
    """The watch's ``Rerun`` with the recording's failing packed step replaced by the first origin
    request alone (``base`` when the failing forward was not a packed one)."""
    f = rec.finding
    if f is None or not pb.seen or f.call.input_index not in pb.packed:
        return base
    t = first_origin(pb) or pb.fail_first_alone(f.call.input_index)
    if t is None or t.position is None:
        pb.notes.append(
            f"forward {f.call.input_index} was a packed batch and no request of it fails alone: "
            "it was not re-run (its inputs hold the whole paged cache), so the location comes from "
            "the capture alone"
        )
        return NotKept(base)
    toks = t.prefix(t.position)
    if toks is None:
        pb.notes.append(
            f"request {t.id}: its tokens before position {t.position} were never seen by the watch "
            "(a reused prefix?), so it was not replayed alone"
        )
        return base
    return AloneRerun(base, f.call.input_index, toks)


class NotKept(AloneRerun):
    """The watch's ``Rerun`` with nothing kept of the failing packed step: ``locate`` says so."""

    def __init__(self, base: Rerun) -> None:
        super().__init__(base, -1, [])

    def inputs(self, step: int) -> None:
        return None

    def forward(self, step: int) -> None:
        return None


def tokenizer_of(model: Any) -> Any | None:
    """The tokenizer saved beside the checkpoint ``model`` was loaded from (``config._name_or_path``
    a local directory with tokenizer files and no remote code; read with ``local_files_only``),
    else None."""
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    if not isinstance(name, str) or not name or not Path(name).is_dir():
        return None
    d = Path(name)
    try:
        if (
            not any((d / f).is_file() for f in TOKENIZER_FILES)
            or custom_code(d, ("tokenizer_config.json",))
            or custom_code(d, ("config.json",), ("AutoTokenizer",))
        ):
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(d), local_files_only=True, trust_remote_code=False)
    except (BadInput, OSError, ValueError):
        return None


def _token(tok: Any, token: int | None) -> dict[str, Any] | None:
    if token is None:
        return None
    text = None
    if tok is not None:
        try:
            text = tok.decode([int(token)])
        except Exception:  # noqa: BLE001 - an id outside the tokenizer's vocabulary: the text is unknown
            text = None
    return {"id": token, "text": text}


def finish(pb: PackedBatches, rep: Report, rec: Recording) -> None:
    """``run.requests``, ``run.evict`` and the serving notes into ``rep`` (a watch that saw packed
    forwards; the report's ``first_nonfinite``/``diagnosis`` are already the first origin's)."""
    if not pb.seen or rep.run is None:
        return
    shared = shared_weight(pb, rec)
    first = first_origin(pb)
    f, d = rep.first_nonfinite, rep.diagnosis
    origins_by_forward: dict[int, str] = {}
    for t in _failed(pb):
        if t.first_forward is not None and pb.judge_alone(t):
            origins_by_forward.setdefault(t.first_forward, t.id)
    out: list[RequestOutcome] = []
    tok = tokenizer_of(pb.w.model) if any(t.token is not None for t in _failed(pb)) else None
    for t in sorted(pb.requests.values(), key=lambda t: _natural(t.id)):
        failed = t.first_forward is not None
        origin = bool(failed and pb.judge_alone(t))
        o = RequestOutcome(t.id, failed, origin)
        if failed:
            o.step, o.position = t.decode_step, t.position
            o.token = _token(tok, t.token)
            if not origin:
                o.poisoned_by = origins_by_forward.get(t.first_forward)  # type: ignore[arg-type]
            elif f is not None and (shared or (first is not None and t.id == first.id)):
                o.module, o.op = f.module, f.op
                o.cause = d.cause if d is not None else None
        out.append(o)
    rep.run.requests = out
    # under abort the others were re-run without the origin (their KV rewritten): only the origin's stays poisoned
    poisoned = [t for t in _failed(pb) if t.blocks_after and (not pb.abort or pb.judge_alone(t))]
    rep.run.evict = [Eviction(t.id, sorted(t.blocks_after), sorted(t.prefixes)) for t in poisoned]
    failed_ids = [o.id for o in out if o.failed]
    if shared and failed_ids:
        where = f.module if f is not None else "a weight"
        rep.notes.append(
            f"every request failed, and each fails alone: the fault is in {where}, a weight shared by "
            f"all requests ({len(failed_ids)} of {len(out)}), not in one request's input"
        )
    elif first is not None:
        reached = [o.id for o in out if o.poisoned_by is not None]
        rep.notes.append(
            f"request {first.id} is the origin: it fails alone, at position {first.position}"
            + (
                f"; {', '.join(reached)} went non-finite only through the packed batch (0 × NaN in the "
                "packed attention) and are finite alone"
                if reached
                else ""
            )
        )
    rep.notes += [n for n in pb.notes if n not in rep.notes]
