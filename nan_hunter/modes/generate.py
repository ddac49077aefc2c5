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
from typing import Any

import torch
from torch import nn

from ..errors import BadInput
from ..model.execute import run_context
from ..model.prepare import Prepared


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
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            bad = watch.first_failed is not None
            if not bad and watch.sink._device_rows:  # rows judged in batches on a GPU: look at the logits
                bad = not bool(torch.isfinite(scores).all())
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
    d.steps = w.n_forwards
    d.first_bad_step = w.first_failed
    good = d.steps if d.first_bad_step is None else d.first_bad_step
    # the token made by step k is at column prompt_width + k; keep those of the steps before the fault
    d.new_tokens = [[int(t) for t in row[prompt_width:prompt_width + good]] for row in seqs]
    d.watch = w
    return d


def generate_block(decoded: list[Decoded], max_new_tokens: int) -> dict[str, Any]:
    """``run.generate`` (contract): per input, in data-set order."""
    by_input: dict[int, list[int]] = {}
    steps = 0
    first_bad: int | None = None
    for d in decoded:
        steps = max(steps, d.steps)
        if d.first_bad_step is not None and first_bad is None:
            first_bad = d.first_bad_step
        for i, toks in zip(d.indices, d.new_tokens):
            by_input[i] = toks
    return {"max_new_tokens": max_new_tokens, "steps": steps, "first_bad_step": first_bad,
            "new_tokens": [by_input[i] for i in sorted(by_input)]}
