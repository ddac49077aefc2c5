"""What a watch keeps of continuous batching, and ``on_fault="abort"``.

``PackedBatches`` is a companion of the watch's recorder (attached and detached with it): it has
the recorder leave the paged cache out of each packed forward's kept inputs (``inputs_left_out``:
a report re-runs one request alone, never the packed batch: see ``serving.alone``); a root
pre-hook reads each packed forward's bookkeeping (``serving.packed``); a root post-hook says which
requests' logits rows went non-finite (only when the sentinel found the outputs non-finite). Per request
it keeps the tokens it read by position, its first failing forward, and the KV blocks it wrote
from then on.

With ``abort``: at a packed forward where some request's rows are non-finite, each such request is
run alone; those that still fail are the origin. The forward is run again without them (same
cache, same slots), so every other request's logits and KV entries are those of a batch without
them, and their rows replace the poisoned ones in the output. After the manager's
``update_batch`` the origin requests end with an error naming the cause (``GenerationOutput.error``)
and their blocks are freed without caching (their prefix hashes dropped: never reused).
``model.init_continuous_batching`` is wrapped while the watch is attached, so the manager that
``generate_batch`` makes is known; the wrap and the hooks are removed when the watch detaches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from ..capture.listener import Companion
from .alone import fails_alone
from .packed import PackedStep, failed_rows, is_packed, logits_of, packed_step

log = logging.getLogger("nan_hunter")

#: packed forwards whose bookkeeping is kept besides the failing ones (a report may need the latest)
KEEP_STEPS = 4


@dataclass
class RequestTrace:
    """One request as the watch saw it across packed forwards."""

    id: str
    tokens: dict[int, int] = field(default_factory=dict)  # position -> token read there
    steps: int = 0  # packed forwards it was in
    first_forward: int | None = None  # the root forward where its rows first went non-finite
    decode_step: int | None = None  # its own step there (0: the forward that read its prompt)
    position: int | None = None  # the position of its first non-finite row
    token: int | None = None  # the token read there
    blocks_after: set[int] = field(default_factory=set)  # KV blocks it wrote from its failing step on
    prompt_len: int | None = None  # from the manager, when known
    alone_fails: bool | None = None  # replayed alone from its tokens up to ``position``
    aborted: str | None = None  # the error it ended with (on_fault="abort")
    prefixes: set[str] = field(default_factory=set)  # prefix-cache hashes registered for blocks_after
    state: int | None = None  # id() of the manager's request state (a new request may reuse an id)

    def prefix(self, upto: int) -> list[int] | None:
        """Its tokens at positions 0..upto, or None when one was never seen (a reused prefix)."""
        toks = [self.tokens.get(p) for p in range(upto + 1)]
        return None if any(t is None for t in toks) else [int(t) for t in toks]  # type: ignore[arg-type]


class PackedBatches(Companion):
    """The watch's view of continuous batching (module docstring)."""

    def __init__(self, watch: Any, abort: bool = False) -> None:
        self.w = watch
        self.abort = abort
        self.requests: dict[str, RequestTrace] = {}
        self.steps: dict[
            int, PackedStep
        ] = {}  # root forward -> its packed requests (failing ones, and the latest)
        self.packed: set[int] = set()  # every root forward that was a packed batch
        self.managers: list[Any] = []
        self.notes: list[str] = []
        self._current: PackedStep | None = None
        self._attached = False
        self._wrapped: list[tuple[Any, str]] = []  # (object, attribute) set on instances, removed at detach
        self._pending: dict[str, str] = {}  # request -> error, ended after update_batch
        self._busy = False

    @property
    def seen(self) -> bool:
        return bool(self.requests)

    # -- attach / detach -------------------------------------------------------------------------
    def attach(self) -> None:
        # its root callbacks run in the recorder's root hooks (capture.listener.Companion): on the
        # compiled wrapper when the watch was given one, eagerly, so a compiled model's program
        # gains no graph break and no guard
        if self._attached:
            return
        self._attached = True
        model = self.w.model
        init = getattr(model, "init_continuous_batching", None)
        if init is not None and "init_continuous_batching" not in vars(model):

            def init_watched(*a: Any, **k: Any) -> Any:
                manager = init(*a, **k)
                if manager not in self.managers:
                    self.managers.append(manager)
                return manager

            model.init_continuous_batching = init_watched
            self._wrapped.append((model, "init_continuous_batching"))

    def detach(self) -> None:
        self._attached = False
        for obj, name in self._wrapped:
            vars(obj).pop(name, None)
        self._wrapped.clear()

    # -- during the run --------------------------------------------------------------------------
    def inputs_left_out(self, kwargs: dict) -> tuple[str, ...]:
        """Keywords the recorder's kept inputs of a forward leave out: a packed forward's paged
        cache (the whole KV memory; a report re-runs one request alone instead), never walked."""
        return ("cache",) if is_packed(kwargs) else ()

    def _processor(self) -> Any:
        for m in self.managers:
            bp = getattr(m, "batch_processor", None)
            if bp is not None:
                return bp
        return None

    def _states(self) -> dict[str, Any]:
        bp = self._processor()
        io = getattr(bp, "inputs_and_outputs", None) if bp is not None else None
        return {fs.state.request_id: fs.state for fs in getattr(io, "requests_in_batch", None) or []}

    def root_start(self, args: tuple, kwargs: dict) -> None:
        if self._busy or not is_packed(kwargs) or self.w.paused:
            self._current = None
            return
        step = packed_step(kwargs)
        self._current = step
        f = self.w.current_step
        snap = self.w.inputs_of(f)
        if snap is not None and "cache" in snap.kwargs:
            # the paged cache is the whole KV memory: a report re-runs one request alone instead
            # (left out of the snapshot already when the recorder asked ``inputs_left_out``)
            cache = snap.kwargs.pop("cache")
            held = {id(t) for t in _tensors_of(cache)}
            snap.versions = [(t, v) for t, v in snap.versions if id(t) not in held]
        states = self._states()
        self._wrap_update()
        for r in step.requests if step is not None else []:
            t = self.requests.get(r.id)
            st = states.get(r.id)
            if t is not None and st is not None and t.state is not None and t.state != id(st):
                # another generate_batch() numbers its requests from req_0 again: keep the earlier one apart
                n = sum(1 for k in self.requests if k.startswith(f"{r.id}@")) + 1
                t.id = f"{r.id}@{n}"
                self.requests[t.id] = self.requests.pop(r.id)
                t = None
            if t is None:
                t = self.requests[r.id] = RequestTrace(r.id, state=id(st) if st is not None else None)
            if st is not None and t.prompt_len is None:
                t.prompt_len = len(st.initial_tokens)
                for p, tok in enumerate(st.initial_tokens):
                    t.tokens.setdefault(p, int(tok))
            for p, tok in zip(r.positions, r.tokens):
                t.tokens[p] = tok
            t.steps += 1
            if t.first_forward is not None:
                t.blocks_after.update(r.blocks)

    def root_end(self, args: tuple, kwargs: dict, output: Any) -> None:
        step, self._current = self._current, None
        if step is None or self._busy:
            return
        logits = logits_of(output)
        if logits is None:
            return
        f = self.w.current_step
        self.packed.add(f)
        self.steps[f] = step
        for old in [k for k in self.steps if k < f - KEEP_STEPS and not self._failed_in(k)]:
            del self.steps[old]
        rec = getattr(self.w, "recorder", None)
        if rec is not None and rec.finite_outputs == f:
            return  # the sentinel's reduction over the outputs found every logit finite
        bad = failed_rows(logits)
        if not bad:
            return
        failed: list[str] = []
        for row in (step.packed_row(i) for i in bad):
            r = step.owner(row)
            if r is None or r.id in failed:
                continue
            failed.append(r.id)
            t = self.requests[r.id]
            if t.first_forward is None:
                i = row - r.start
                t.first_forward, t.position, t.token = f, r.positions[i], r.tokens[i]
                t.decode_step = (
                    max(0, r.positions[-1] - (t.prompt_len - 1)) if t.prompt_len is not None else t.steps - 1
                )
                t.blocks_after.update(r.blocks)
        if self.abort:
            self._contain(step, failed, kwargs, output, logits)  # the logits mended in place

    def _failed_in(self, forward: int) -> bool:
        return any(t.first_forward == forward for t in self.requests.values())

    def fail_first_alone(self, forward: int) -> RequestTrace | None:
        """A packed forward the recording found failing while no request's logits did (a fault that
        did not reach them): its first request that fails alone, marked as failing there."""
        step = self.steps.get(forward)
        for r in step.requests if step is not None else []:
            t = self.requests.get(r.id)
            toks = t.prefix(r.positions[-1]) if t is not None else None
            if t is not None and toks is not None and self.fails_alone(toks):
                t.first_forward, t.position, t.token, t.alone_fails = (
                    forward,
                    r.positions[-1],
                    r.tokens[-1],
                    True,
                )
                t.decode_step = (
                    max(0, r.positions[-1] - (t.prompt_len - 1)) if t.prompt_len is not None else None
                )
                t.blocks_after.update(r.blocks)
                return t
        return None

    # -- abort -----------------------------------------------------------------------------------
    def judge_alone(self, t: RequestTrace) -> bool | None:
        """Whether request ``t`` fails replayed alone from its own tokens (cached)."""
        if t.alone_fails is None and t.position is not None:
            toks = t.prefix(t.position)
            if toks is None:
                return None
            t.alone_fails = self.fails_alone(toks)
        return t.alone_fails

    def fails_alone(self, tokens: list[int]) -> bool:
        """Whether ``tokens`` run alone give a non-finite logit at their last position (not recorded)."""
        was, self._busy = self._busy, True
        paused, self.w.paused = self.w.paused, True
        try:
            return fails_alone(self.w.model, tokens, self.w.run)
        finally:
            self._busy, self.w.paused = was, paused

    def _contain(
        self, step: PackedStep, failed: list[str], kwargs: dict, output: Any, logits: torch.Tensor
    ) -> None:
        origins = [rid for rid in failed if self.judge_alone(self.requests[rid]) and rid not in self._pending]
        if not origins:
            return
        keep = [r for r in step.requests if r.id not in origins]
        if keep:
            reduced = _without(kwargs, step, {r.id for r in keep})
            if reduced is None:
                self.notes.append(
                    "abort: the packed forward could not be re-run without the faulty request "
                    "(a block-table decode path); the other requests' logits of that step are as computed"
                )
            else:
                was, self._busy = self._busy, True
                paused, self.w.paused = self.w.paused, True
                try:
                    with torch.no_grad():
                        again = logits_of(self.w.model(**reduced))
                finally:
                    self._busy, self.w.paused = was, paused
                if again is not None:
                    rows = step.rows({r.id for r in keep})
                    if step.kept_rows is not None:  # logits of the kept rows only: theirs, in order
                        rows = [i for i, row in enumerate(step.kept_rows) if row in set(rows)]
                    logits[0, rows] = again[0, : len(rows)].to(logits.dtype)
        for rid in origins:
            self._pending[rid] = ""  # the error is written after the forward, with the cause (_cause)

    def _wrap_update(self) -> None:
        bp = self._processor()
        if bp is None or "update_batch" in vars(bp):
            return
        original = bp.update_batch

        def update_batch() -> None:
            if not self._pending:
                original()
                self._note_prefixes(bp)
                return
            pending = {rid: err for rid, err in self._pending.items() if not self.requests[rid].aborted}
            if pending:
                cause = self._cause()
                pending = {rid: self._error(rid, cause) for rid in pending}
            states = self._states()
            placeholder = []
            for rid in pending:
                st = states.get(rid)
                if st is None:
                    continue
                if st.generated_len() == 0:  # else update_batch would move it to DECODING and give it a token
                    st.generated_tokens.append(-1)
                    placeholder.append(rid)
                st.status = type(st.status).FAILED
            original()
            self._note_prefixes(bp)
            for rid, err in pending.items():
                st = states.get(rid)
                if st is None:
                    continue
                if rid in placeholder:
                    st.generated_tokens.pop()
                bp.cache.free_blocks(rid, no_cache=True)  # its blocks go back without their prefix hashes
                bp.scheduler.active_requests.pop(rid, None)
                bp.output_router.fail_and_deliver(st, RuntimeError(err))
                self.requests[rid].aborted = err
                log.warning("nanhunter: %s", err)

        bp.update_batch = update_batch
        self._wrapped.append((bp, "update_batch"))

    def _cause(self) -> str:
        """What the watch's report says of the first fault (module, op, cause), made now: after the
        forward, before the manager hands out the request's result."""
        was, self._busy = self._busy, True
        try:
            rep = self.w.report()
        except Exception as e:  # noqa: BLE001 - the request is aborted whatever the report says
            return f"(the report could not be made: {type(e).__name__}: {e})"
        finally:
            self._busy = was
        f, d = rep.first_nonfinite, rep.diagnosis
        if f is None:
            return "non-finite logits"
        where = f"{f.op} in {f.module}" if f.op else f.module
        said = f"{d.cause}: {d.summary}" if d is not None else f"{f.kind} at {where}"
        if f.role == "weights":  # no request's input is to blame: every request reads that weight
            return f"the fault is in a weight every request reads ({f.module}), not in this request's input — {said}"
        return said

    def _error(self, rid: str, cause: str) -> str:
        t = self.requests[rid]
        return (
            f"nanhunter aborted request {rid} (on_fault='abort'): non-finite at decode step {t.decode_step}, "
            f"position {t.position}, token {t.token}, and it fails alone — {cause}"
        )

    # -- the report ------------------------------------------------------------------------------
    def _note_prefixes(self, bp: Any) -> None:
        """The prefix-cache hashes the manager registered (in ``update_batch``) for blocks a failing
        request wrote: kept now, since the manager and its cache may be gone by ``report()``."""
        allocators = list(getattr(getattr(bp, "cache", None), "cache_allocators", {}).values())
        for t in self.requests.values():
            for a in allocators if t.blocks_after else []:
                for b in t.blocks_after:
                    h = a.ledger.block_to_hash.get(b)
                    if h is not None:
                        t.prefixes.add(f"{h:#x}")


def _tensors_of(obj: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for a in getattr(obj, "cache_allocators", {}).values():
        for v in vars(a).values():
            if isinstance(v, torch.Tensor):
                out.append(v)
            elif isinstance(v, dict):
                out += [
                    x
                    for pair in v.values()
                    if isinstance(pair, tuple)
                    for x in pair
                    if isinstance(x, torch.Tensor)
                ]
    t = getattr(obj, "cache_tensor", None)
    if isinstance(t, torch.Tensor):
        out.append(t)
    return out


def _without(kwargs: dict, step: PackedStep, keep: set[str]) -> dict | None:
    """A packed forward's keywords with only the requests ``keep`` (their rows, cache slots, keys and
    mask), or None when the forward reads the cache through a block table."""
    if kwargs.get("block_table") is not None:
        return None
    kept = [r for r in step.requests if r.id in keep]
    rows = torch.tensor([i for r in kept for i in range(r.start, r.stop)], dtype=torch.long)
    out = dict(kwargs)
    dev = kwargs["input_ids"].device
    rows_d = rows.to(dev)
    out["input_ids"] = kwargs["input_ids"][:, rows_d]
    out["position_ids"] = kwargs["position_ids"][:, rows_d]
    cu_q = [0]
    for r in kept:
        cu_q.append(cu_q[-1] + r.stop - r.start)
    out["cu_seq_lens_q"] = torch.tensor(cu_q, dtype=kwargs["cu_seq_lens_q"].dtype, device=dev)
    idx = [step.requests.index(r) for r in kept]
    cols: dict[str, torch.Tensor] = {}
    out["cu_seq_lens_k"] = {}
    for layer_type, cu in kwargs["cu_seq_lens_k"].items():
        ck = [int(v) for v in cu.tolist()]
        new = [0]
        c: list[int] = []
        for i in idx:
            new.append(new[-1] + ck[i + 1] - ck[i])
            c += list(range(ck[i], ck[i + 1]))
        out["cu_seq_lens_k"][layer_type] = torch.tensor(new, dtype=cu.dtype, device=dev)
        cols[layer_type] = torch.tensor(c, dtype=torch.long, device=dev)
    li = []
    for r in kept:
        base = sum(k.stop - k.start for k in kept[: kept.index(r)])
        li.append(base + (r.stop - r.start) - 1)
    has = set(int(v) for v in kwargs["logits_indices"].tolist())
    out["logits_indices"] = torch.tensor(
        [v for r, v in zip(kept, li) if r.stop - 1 in has], dtype=kwargs["logits_indices"].dtype, device=dev
    )
    out["write_index"] = [w[rows_d] for w in kwargs["write_index"]]
    layer_types = list(kwargs["cu_seq_lens_k"])
    out["read_index"] = [
        ri[cols[layer_types[min(i, len(layer_types) - 1)]]] if ri.numel() else ri
        for i, ri in enumerate(kwargs["read_index"])
    ]
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        out["attention_mask"] = mask[..., rows_d, :][..., cols[layer_types[0]]]
    elif isinstance(mask, dict):
        out["attention_mask"] = {k: m[..., rows_d, :][..., cols[k]] for k, m in mask.items()}
    if isinstance(kwargs.get("logits_to_keep"), torch.Tensor):
        out["logits_to_keep"] = out["logits_indices"]
    lpa = kwargs.get("logits_processor_args")
    if isinstance(lpa, torch.Tensor) and lpa.dim() == 2:
        out["logits_processor_args"] = lpa[:, torch.tensor(idx, dtype=torch.long, device=lpa.device)]
    return out
