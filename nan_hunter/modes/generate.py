"""``scan --generate N``: greedy decoding through the model's own ``generate()``, captured step
by step (docs/contract.md, "Generation").

Every forward of ``generate()`` is one step of the harness's capture at module level: step 0 is
the prompt's forward (prefill), step k the k-th decode step. A stopping criterion ends decoding at
the first step that produced a non-finite value. The capture keeps that step's inputs — the KV
cache as it was when the step started — so location, replay and diagnosis re-run the failing
module of that very step from copies, never the whole generation, and never the user's cache.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..capture.targeted import rows_holding_faults
from ..errors import BadInput
from ..locate.rerun import KeptSteps
from ..model.execute import run_context
from ..model.prepare import Prepared
from ..model.whole import WholeModel
from .base import ModeBase
from .failing_prefix import shortest_failing_prefix
from .harness import capture

if TYPE_CHECKING:  # pragma: no cover
    from ..locate.located import Located
    from ..locate.rerun import Rerun
    from ..report import ModuleRow, Report
    from .protocol import Capture


def check_can_generate(model: nn.Module) -> None:
    gen = getattr(model, "generate", None)
    can = getattr(model, "can_generate", None)
    if not callable(gen) or (callable(can) and not can()):
        raise BadInput(
            f"--generate: {type(model).__name__} has no generate() (decoding needs a causal LM such as "
            "a Hugging Face *ForCausalLM, or an --arch model with generate()); drop --generate to scan "
            "one forward"
        )


def pad_token_id(p: Prepared) -> int:
    """The tokenizer's pad token (else its eos token, else the model's generation config's)."""
    tok = p.tokenizer
    if tok is not None:
        for pid in (tok.pad_token_id, tok.eos_token_id):
            if pid is not None:
                return int(pid)
    return int(getattr(getattr(p.model, "generation_config", None), "pad_token_id", None) or 0)


def left_pad(batches: list[dict[str, Any]], pad_id: int) -> tuple[dict[str, Any], list[int], list[int]]:
    """The inputs as one left-padded batch, as servers decode them: (kwargs, prompt lengths, pads).
    Every other per-token input the prompts carry (``token_type_ids``, which transformers 4.x
    tokenizers return and GPT-2 embeds) is padded with 0 as the tokenizer pads it, so a row decodes
    with the same inputs as its prompt alone."""
    ids = [b["input_ids"][0] for b in batches]
    masks = [b.get("attention_mask", torch.ones_like(b["input_ids"]))[0] for b in batches]
    width = max(int(x.shape[0]) for x in ids)
    pads = [width - int(x.shape[0]) for x in ids]
    input_ids = torch.stack([torch.cat([x.new_full((p,), pad_id), x]) for x, p in zip(ids, pads)])
    mask = torch.stack([torch.cat([m.new_zeros((p,)), m]) for m, p in zip(masks, pads)])
    out = {"input_ids": input_ids, "attention_mask": mask}
    for key in batches[0]:
        if key in out or not all(_per_token(b.get(key), b["input_ids"]) for b in batches):
            continue
        out[key] = torch.stack(
            [torch.cat([b[key][0].new_zeros((p,)), b[key][0]]) for b, p in zip(batches, pads)]
        )
    return out, [int(x.shape[0]) for x in ids], pads


def _per_token(value: Any, input_ids: torch.Tensor) -> bool:
    return isinstance(value, torch.Tensor) and value.shape == input_ids.shape


def stop_on_fault(watch: Any) -> Any:
    """A transformers StoppingCriteria that ends decoding once a step went non-finite."""
    from transformers import StoppingCriteria

    class StopOnNonfinite(StoppingCriteria):
        def __init__(self) -> None:
            self.steps = 0

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            # ``scores`` is None unless generate() was asked for them (transformers 5): not read.
            # On a GPU the rows are judged in batches; the device flags of the forwards so far are
            # read here (decoding reads its stopping verdict on the host every step anyway).
            self.steps += 1
            again = getattr(watch, "rerun_steps", None)
            if (
                again is not None
            ):  # a trace's --repeat re-run, capture paused: it stops where the first run did
                bad = self.steps >= again
                return torch.full((input_ids.shape[0],), bad, dtype=torch.bool, device=input_ids.device)
            if watch.first_failed is None and watch.sink._device_rows:
                watch.judge_flagged()
            bad = watch.first_failed is not None
            return torch.full((input_ids.shape[0],), bad, dtype=torch.bool, device=input_ids.device)

    return StopOnNonfinite()


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
    return {
        "max_new_tokens": max_new_tokens,
        "steps": steps,
        "first_bad_step": first_bad,
        "new_tokens": [by_input[i] for i in sorted(by_input)],
    }


# --- the mode ---------------------------------------------------------------------------------------


class GenerateMode(ModeBase):
    """``--generate N [--batch]``: greedy decoding under capture (module docstring). A group is one
    ``generate()`` call: one prompt, or with ``--batch`` every prompt as one left-padded batch."""

    name = "generate"
    one_step_table = True
    compares_outputs = False  # a run passes when every module output of every step stayed finite
    retain = 1  # the latest decode step (and the first failing one) kept in full

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
                raise BadInput(
                    f"--generate: input #{i} ({p.labels[i]}) has no single row of input_ids; decoding "
                    "needs token ids (--prompt, --data, or --inputs files holding input_ids of shape [1, T])"
                )

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        """One greedy decoding, stopped at the first non-finite step; nothing to compare (a run passes
        when every module output of every step stayed finite)."""
        self._generate(model, kwargs, recorder)
        return []

    def _generate(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> Any:
        from transformers import StoppingCriteriaList

        return model.generate(
            **kwargs,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=self.pad_id,
            stopping_criteria=StoppingCriteriaList([stop_on_fault(recorder)]),
        )

    def groups(self, p: Prepared, indices: list[int]) -> list[list[int]]:
        return [list(indices)] if self.batched else [[i] for i in indices]

    def run_group(self, p: Prepared, group: list[int], recorder: Any) -> dict[str, Any]:
        """One ``generate()`` over the inputs ``group`` (one row each): which inputs it decoded, how
        many steps ran, the first failing step and the new tokens of the steps before it."""
        if self.batched:
            kw, _, _ = left_pad([p.batches[i] for i in group], self.pad_id if self.pad_id is not None else 0)
        else:
            kw = dict(p.batches[group[0]])
        prompt_width = int(kw["input_ids"].shape[-1])
        try:
            with torch.no_grad(), run_context(p.run):
                out = recorder.input_run(group[0], lambda: self._generate(p.model, kw, recorder))
        except BadInput:
            raise
        except Exception as e:  # noqa: BLE001 - the model's own code raised: bad input, one line
            msg = str(e).splitlines()[0] if str(e) else ""
            raise BadInput(f"--generate: the model raised {type(e).__name__} in generate(): {msg}") from None
        seqs = out.sequences if hasattr(out, "sequences") else out
        if recorder.first_failed is None and recorder.sink._device_rows:
            recorder.judge_flagged()  # the last step's flag may not have been read by the stopping criterion
        steps, bad = recorder.n_forwards, recorder.first_failed
        good = steps if bad is None else bad
        # the token made by step k is at column prompt_width + k; keep those of the steps before the fault
        return {
            "indices": list(group),
            "steps": steps,
            "first_bad_step": bad,
            "new_tokens": [[int(t) for t in row[prompt_width : prompt_width + good]] for row in seqs],
        }

    def input_of(self, cap: Capture, step: int) -> int:
        return cap.group[0]  # every step decodes the whole group; the row holding a fault says which input

    def failed_of(self, p: Prepared, cap: Capture) -> list[int]:
        bad = cap.facts.get("first_bad_step")
        if bad is None:
            return []
        if not self.batched:
            return [cap.group[0]]
        rows = rows_holding_faults(p.model, cap.recorder.inputs_of(bad), run_context(p.run))
        return [cap.group[r] for r in rows]

    def renumber(self, cap: Capture, table: list[ModuleRow]) -> list[ModuleRow]:
        """Module rows of a decoding: the recorder counts steps; the report names the data-set input."""
        for row in table:
            row["step"], row["input_index"] = row["input_index"], cap.group[0]
        return table

    def facts(self, p: Prepared, caps: list[Capture], failed: list[int]) -> dict[str, Any]:
        return {
            "decodings": [c.facts for c in caps],
            "shortest_failing_prefix": _shortest_prefixes(p, failed, self.max_new_tokens, self.pad_id),
        }

    def rerun(self, p: Prepared, cap: Capture) -> Rerun:
        # the prompt's own forward (step 0, one prompt) may be checked on a copy of the whole model
        whole = (
            None
            if self.batched
            else lambda step: (
                WholeModel(p.model, (), p.batches[cap.group[0]], p.master) if step == 0 else None
            )
        )
        return KeptSteps(cap.recorder, cap.keep.contexts, p.run, whole=whole)

    def place(self, p: Prepared, cap: Capture, loc: Located) -> None:
        """The row holding the fault names the input; its token and the text before it for the view."""
        index = cap.group[min(loc.row or 0, len(cap.group) - 1)]
        loc.first.input_index = index
        loc.input_label = p.labels[index]
        loc.extra = _fault_text(p, cap.facts, index, loc.first.position)

    def merge(self, extras: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "decodings": [d for e in extras for d in e.get("decodings", [])],
            "shortest_failing_prefix": {
                k: v for e in extras for k, v in e.get("shortest_failing_prefix", {}).items()
            },
        }

    def finish(self, p: Prepared, rep: Report, extra: dict[str, Any], located: Located | None) -> None:
        decodings = sorted(extra.get("decodings", []), key=lambda d: d["indices"][0] if d["indices"] else 0)
        assert rep.run is not None  # protocol.fill sets it before finish
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
            rep.notes.append(
                f"the batch stopped at step {step}: inputs {', '.join(f'#{i}' for i in rest)} were "
                f"decoded only up to it; run without --batch to decode each of them to "
                f"{self.max_new_tokens} tokens"
            )


def _per_input(decodings: list[dict[str, Any]], failed: list[int]) -> list[dict[str, Any]]:
    """Per input, in data-set order: whether it failed and at which step (prompt sensitivity)."""
    rows = []
    for d in decodings:
        for i in d["indices"]:
            rows.append(
                {
                    "index": i,
                    "failed": i in failed,
                    "step": d["first_bad_step"] if i in failed else None,
                    "steps": d["steps"],
                }
            )
    return sorted(rows, key=lambda r: r["index"])


def _shortest_prefixes(
    p: Prepared, failed: list[int], max_new_tokens: int, pad_id: int | None
) -> dict[str, int]:
    """For each failing input, the fewest prompt tokens whose greedy decoding still goes
    non-finite within ``max_new_tokens`` (the search of ``bisect --over inputs``)."""
    one_by_one = GenerateMode(max_new_tokens)
    one_by_one.pad_id = pad_id
    out: dict[str, int] = {}
    for i in failed:
        kw = p.batches[i]
        length = int(kw["input_ids"].shape[-1])

        def fails(n: int, kw: dict = kw, length: int = length) -> bool:
            cut = {
                k: v[:, :n] if hasattr(v, "dim") and v.dim() == 2 and v.shape[1] == length else v
                for k, v in kw.items()
            }
            one = replace(p, batches=[cut], labels=["prefix"])
            return capture(one, one_by_one, [0]).facts["first_bad_step"] is not None

        n = shortest_failing_prefix(length, fails)
        if n is not None:
            out[str(i)] = n
    return out


def _fault_text(p: Prepared, decoding: dict[str, Any], index: int, position: int | None) -> dict[str, Any]:
    """The token the failing step read and the text generated before it, for the terminal view."""
    row = decoding["indices"].index(index)
    new = decoding["new_tokens"][row]
    ids = p.batches[index]["input_ids"][0].tolist() + new
    token = ids[position] if position is not None and 0 <= position < len(ids) else None
    tok = p.tokenizer

    def text(x: list[int]) -> str | None:
        return tok.decode(x) if tok is not None else None

    return {
        "fault_token": None if token is None else {"id": token, "text": text([token])},
        "text_before_fault": text(new),
    }
