"""``scan --generate N``: greedy decoding through the model's own ``generate()``, captured step
by step (docs/contract.md, "Generation").

Every forward of ``generate()`` is one step of a ``Watch`` at module level: step 0 is the
prompt's forward (prefill), step k the k-th decode step. A stopping criterion ends decoding at
the first step that produced a non-finite value. The watch keeps that step's inputs — the KV
cache as it was when the step started — so location, replay and diagnosis re-run the failing
module of that very step from copies, never the whole generation, and never the user's cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import BadInput
from ..model.execute import run_context
from ..model.prepare import Prepared
from .recording import Recording

if TYPE_CHECKING:  # pragma: no cover
    from ..explain.assemble import Located
    from ..report import Report


@dataclass
class Decoded:
    """One ``generate()`` call: which data-set inputs it decoded and what came of it."""

    indices: list[int]  # data-set indices of the rows (one for unbatched decoding)
    prompt_lens: list[int]  # each row's own prompt length (padding excluded)
    pads: list[int]  # left padding per row
    steps: int = 0  # forwards run, prefill included
    first_bad_step: int | None = None
    new_tokens: list[list[int]] = field(default_factory=list)  # per row, before first_bad_step
    failed_rows: list[int] = field(default_factory=list)  # rows holding a fault at first_bad_step
    watch: Any = None


def check_can_generate(model: nn.Module) -> None:
    gen = getattr(model, "generate", None)
    can = getattr(model, "can_generate", None)
    if not callable(gen) or (callable(can) and not can()):
        raise BadInput(f"--generate: {type(model).__name__} has no generate() (decoding needs a causal LM such as "
                       "a Hugging Face *ForCausalLM, or an --arch model with generate()); drop --generate to scan "
                       "one forward")


def pad_token_id(p: Prepared) -> int:
    """The tokenizer's pad token (else its eos token, else the model's generation config's)."""
    tok = p.tokenizer
    if tok is not None:
        for pid in (tok.pad_token_id, tok.eos_token_id):
            if pid is not None:
                return int(pid)
    return int(getattr(getattr(p.model, "generation_config", None), "pad_token_id", None) or 0)


def left_pad(batches: list[dict[str, Any]], pad_id: int) -> tuple[dict[str, Any], list[int], list[int]]:
    """The inputs as one left-padded batch, as servers decode them: (kwargs, prompt lengths, pads)."""
    ids = [b["input_ids"][0] for b in batches]
    masks = [b.get("attention_mask", torch.ones_like(b["input_ids"]))[0] for b in batches]
    width = max(int(x.shape[0]) for x in ids)
    pads = [width - int(x.shape[0]) for x in ids]
    input_ids = torch.stack([torch.cat([x.new_full((p,), pad_id), x]) for x, p in zip(ids, pads)])
    mask = torch.stack([torch.cat([m.new_zeros((p,)), m]) for m, p in zip(masks, pads)])
    return {"input_ids": input_ids, "attention_mask": mask}, [int(x.shape[0]) for x in ids], pads


def stop_on_fault(watch: Any) -> Any:
    """A transformers StoppingCriteria that ends decoding once a step went non-finite."""
    from transformers import StoppingCriteria

    class StopOnNonfinite(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            # ``scores`` is None unless generate() was asked for them (transformers 5): not read.
            # On a GPU the rows are judged in batches; the device flags of the forwards so far are
            # read here (decoding reads its stopping verdict on the host every step anyway).
            if watch.first_failed is None and watch.sink._device_rows:
                watch.judge_flagged()
            bad = watch.first_failed is not None
            return torch.full((input_ids.shape[0],), bad, dtype=torch.bool, device=input_ids.device)

    return StopOnNonfinite()


def decode(p: Prepared, indices: list[int], max_new_tokens: int, batched: bool) -> Decoded:
    """Run ``generate()`` once over the inputs ``indices`` (one row each) under a module-level watch."""
    from transformers import StoppingCriteriaList

    from ..session.watcher import Watch

    pad_id = pad_token_id(p)
    if batched:
        kw, lens, pads = left_pad([p.batches[i] for i in indices], pad_id)
    else:
        kw = dict(p.batches[indices[0]])
        lens, pads = [int(kw["input_ids"].shape[-1])], [0]
    d = Decoded(indices, lens, pads)
    w = Watch(p.model, level="modules", retain=1, dtype=p.run)
    prompt_width = int(kw["input_ids"].shape[-1])
    try:
        with w, torch.no_grad(), run_context(p.run):
            out = p.model.generate(**kw, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                   pad_token_id=pad_id, stopping_criteria=StoppingCriteriaList([stop_on_fault(w)]))
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 - the model's own code raised: bad input, one line
        msg = str(e).splitlines()[0] if str(e) else ""
        raise BadInput(f"--generate: the model raised {type(e).__name__} in generate(): {msg}") from None
    seqs = out.sequences if hasattr(out, "sequences") else out
    if w.first_failed is None and w.sink._device_rows:
        w.judge_flagged()  # the last step's flag may not have been read by the stopping criterion
    d.steps = w.n_forwards
    d.first_bad_step = w.first_failed
    good = d.steps if d.first_bad_step is None else d.first_bad_step
    # the token made by step k is at column prompt_width + k; keep those of the steps before the fault
    d.new_tokens = [[int(t) for t in row[prompt_width:prompt_width + good]] for row in seqs]
    d.watch = w
    return d


def generate_block(decodings: list[dict[str, Any]], max_new_tokens: int) -> dict[str, Any]:
    """``run.generate`` (contract): per input, in data-set order, from each decoding's facts
    (``indices``, ``steps``, ``first_bad_step``, ``new_tokens``)."""
    by_input: dict[int, list[int]] = {}
    steps = 0
    first_bad: int | None = None
    for d in decodings:
        steps = max(steps, d["steps"])
        if d["first_bad_step"] is not None and first_bad is None:
            first_bad = d["first_bad_step"]
        for i, toks in zip(d["indices"], d["new_tokens"]):
            by_input[i] = toks
    return {"max_new_tokens": max_new_tokens, "steps": steps, "first_bad_step": first_bad,
            "new_tokens": [by_input[i] for i in sorted(by_input)]}


# --- the mode ---------------------------------------------------------------------------------------


class GenerateMode:
    """``--generate N [--batch]``: greedy decoding under capture (module docstring)."""

    name = "generate"
    one_step_table = True

    def __init__(self, max_new_tokens: int, batched: bool = False) -> None:
        self.max_new_tokens = max_new_tokens
        self.batched = batched
        self.pad_id: int | None = None  # the tokenizer's, known once a model is given (``check``)

    @classmethod
    def wanted(cls, request: Any) -> bool:
        return request.generate is not None

    @classmethod
    def from_request(cls, request: Any) -> GenerateMode:
        return cls(request.generate, request.batch)

    def check(self, p: Prepared) -> None:
        check_can_generate(p.model)
        self.pad_id = pad_token_id(p)
        for i, b in enumerate(p.batches):
            ids = b.get("input_ids")
            if not (hasattr(ids, "dim") and ids.dim() == 2 and ids.shape[0] == 1):
                raise BadInput(f"--generate: input #{i} ({p.labels[i]}) has no single row of input_ids; decoding "
                               "needs token ids (--prompt, --data, or --inputs files holding input_ids of shape [1, T])")

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        """One greedy decoding, stopped at the first non-finite step; nothing to compare (a run passes
        when every module output of every step stayed finite)."""
        from transformers import StoppingCriteriaList

        model.generate(**kwargs, max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1,
                       pad_token_id=self.pad_id,
                       stopping_criteria=StoppingCriteriaList([stop_on_fault(recorder)]))
        return []

    def record(self, p: Prepared, indices: list[int]) -> Recording:
        from ..capture.targeted import rows_holding_faults
        from ..locate.producer import call_table, first_finding, mask_notes

        groups = [indices] if self.batched else [[i] for i in indices]
        decoded = [decode(p, g, self.max_new_tokens, self.batched) for g in groups if g]
        failed: list[int] = []
        first = None
        for d in decoded:
            if d.first_bad_step is None:
                continue
            snap = d.watch.inputs_of(d.first_bad_step)
            d.failed_rows = rows_holding_faults(p.model, snap, run_context(p.run)) if self.batched else [0]
            failed += [d.indices[r] for r in d.failed_rows]
            first = first or d
        failed = sorted(set(failed))
        extra: dict[str, Any] = {
            "decodings": [{"indices": d.indices, "steps": d.steps, "first_bad_step": d.first_bad_step,
                           "new_tokens": d.new_tokens} for d in decoded],
            "shortest_failing_prefix": _shortest_prefixes(p, failed, self.max_new_tokens),
        }
        if first is None:
            if not decoded:
                return Recording(None, None, [], [], extra=extra)
            last = decoded[-1].watch
            rows = last.sink.rows()
            return Recording(None, None, failed, _by_input(call_table(last.calls, rows), decoded[-1].indices[0]),
                             mask_notes(last.calls, rows), extra=extra)
        w, step = first.watch, first.first_bad_step
        rows = w.sink.rows()
        step_calls = [c for c in w.calls if c.input_index == step]
        finding = first_finding(step_calls, rows)
        return Recording(finding, first.indices[0], failed, _by_input(call_table(step_calls, rows), first.indices[0]),
                         mask_notes(step_calls, rows), extra=extra, state=first)

    def locate(self, p: Prepared, rec: Recording, replay: bool) -> Located:
        """The failing step re-run from its own inputs (the KV cache as it was), then the row and
        token position holding the fault."""
        from ..locate.position import token_position
        from ..tree import detached_copy
        from .forward import locate_forward

        first: Decoded = rec.state
        step = first.first_bad_step
        snap = first.watch.inputs_of(step)

        def rerun() -> Any:
            args, kwargs = snap.rerun()
            with torch.no_grad(), run_context(p.run):
                return p.model(*args, **kwargs)

        loc = locate_forward(p, rec.finding, rerun, first.indices[0], replay, step=step)
        target, margs, mkw = loc.region
        with torch.no_grad(), run_context(p.run):
            out = target(*detached_copy(margs), **detached_copy(mkw))
        tp = token_position(out, snap.kwargs)
        row, pos = tp.row, tp.position
        if tp.note:
            loc.notes.append(tp.note)
        index = first.indices[min(row, len(first.indices) - 1)]
        loc.first.input_index = index
        loc.first.position = pos
        loc.input_label = p.labels[index]
        loc.extra = _fault_text(p, first, index, step, pos)
        return loc

    def merge(self, extras: list[dict[str, Any]]) -> dict[str, Any]:
        return {"decodings": [d for e in extras for d in e.get("decodings", [])],
                "shortest_failing_prefix": {k: v for e in extras for k, v in e.get("shortest_failing_prefix", {}).items()}}

    def finish(self, p: Prepared, rep: Report, extra: dict[str, Any], located: Located | None) -> None:
        decodings = sorted(extra.get("decodings", []), key=lambda d: d["indices"][0] if d["indices"] else 0)
        failed = rep.run.failed_inputs
        block = generate_block(decodings, self.max_new_tokens)
        block["per_input"] = _per_input(decodings, failed)
        if failed:
            block["shortest_failing_prefix"] = extra.get("shortest_failing_prefix", {})
        if located is not None:
            block.update(located.extra)
        rep.run.generate = block
        if self.batched and located is not None and len(p.batches) > len(failed):
            step = located.first.step
            rest = [i for i in range(len(p.batches)) if i not in failed]
            rep.notes.append(f"the batch stopped at step {step}: inputs {', '.join(f'#{i}' for i in rest)} were "
                             f"decoded only up to it; run without --batch to decode each of them to "
                             f"{self.max_new_tokens} tokens")


def _by_input(table: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """Module rows of a decoding: the recorder counts steps; the report names the data-set input."""
    for row in table:
        row["step"], row["input_index"] = row["input_index"], index
    return table


def _per_input(decodings: list[dict[str, Any]], failed: list[int]) -> list[dict[str, Any]]:
    """Per input, in data-set order: whether it failed and at which step (prompt sensitivity)."""
    rows = []
    for d in decodings:
        for i in d["indices"]:
            rows.append({"index": i, "failed": i in failed,
                         "step": d["first_bad_step"] if i in failed else None, "steps": d["steps"]})
    return sorted(rows, key=lambda r: r["index"])


def _shortest_prefixes(p: Prepared, failed: list[int], max_new_tokens: int) -> dict[str, int]:
    """For each failing input, the fewest prompt tokens whose greedy decoding still goes
    non-finite within ``max_new_tokens`` (the search of ``bisect --over inputs``)."""
    from dataclasses import replace

    from .failing_prefix import shortest_failing_prefix

    out: dict[str, int] = {}
    for i in failed:
        kw = p.batches[i]
        length = int(kw["input_ids"].shape[-1])

        def fails(n: int, kw: dict = kw, length: int = length) -> bool:
            cut = {k: v[:, :n] if hasattr(v, "dim") and v.dim() == 2 and v.shape[1] == length else v
                   for k, v in kw.items()}
            one = replace(p, batches=[cut], labels=["prefix"])
            return decode(one, [0], max_new_tokens, batched=False).first_bad_step is not None

        n = shortest_failing_prefix(length, fails)
        if n is not None:
            out[str(i)] = n
    return out


def _fault_text(p: Prepared, d: Decoded, index: int, step: int, position: int | None) -> dict[str, Any]:
    """The token the failing step read and the text generated before it, for the terminal view."""
    row = d.indices.index(index)
    ids = p.batches[index]["input_ids"][0].tolist() + d.new_tokens[row]
    token = ids[position] if position is not None and 0 <= position < len(ids) else None
    tok = p.tokenizer

    def text(x: list[int]) -> str | None:
        return tok.decode(x) if tok is not None else None

    return {"fault_token": None if token is None else {"id": token, "text": text([token])},
            "text_before_fault": text(d.new_tokens[row])}
