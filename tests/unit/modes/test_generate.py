"""nan_hunter/modes/generate.py, the parts without a decoding: left padding, the ``run.generate``
block, per-input rows, merging extras across ranks, ``finish`` and the model/pad-token checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.config import default_config
from nan_hunter.dtypes import RunDtype
from nan_hunter.errors import BadInput
from nan_hunter.explain.assemble import Located
from nan_hunter.model.prepare import Prepared
from nan_hunter.modes.generate import (
    GenerateMode,
    _per_input,
    check_can_generate,
    generate_block,
    left_pad,
    pad_token_id,
)
from nan_hunter.report import FirstNonfinite, Report, RunInfo


def prepared(model, batches) -> Prepared:
    return Prepared(
        None,
        model,
        None,
        "test",
        batches,
        [f"prompt {i}" for i in range(len(batches))],
        RunDtype.of("fp32"),
        torch.device("cpu"),
        default_config(),
    )


def ids(*t: int) -> torch.Tensor:
    return torch.tensor([list(t)])


# --- left_pad -----------------------------------------------------------------------------------


def test_left_pad_pads_short_rows_on_the_left_and_masks_the_padding():
    kw, lens, pads = left_pad(
        [
            {"input_ids": ids(5, 6, 7)},
            {"input_ids": ids(8)},
            {"input_ids": ids(1, 2), "attention_mask": torch.tensor([[0, 1]])},
        ],
        pad_id=0,
    )
    assert lens == [3, 1, 2] and pads == [0, 2, 1]
    assert kw["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8], [0, 1, 2]]
    # a row's own mask is kept after its padding (row 2 brought a 0 of its own)
    assert kw["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert kw["input_ids"].dtype == torch.int64


def test_left_pad_uses_the_given_pad_id_and_never_writes_the_inputs():
    a = {"input_ids": ids(3)}
    kw, _, _ = left_pad([a, {"input_ids": ids(4, 4, 4)}], pad_id=9)
    assert kw["input_ids"][0].tolist() == [9, 9, 3]
    assert a["input_ids"].tolist() == [[3]]


def test_left_pad_keeps_the_prompts_other_per_token_inputs_padded_with_zero():
    """transformers 4.x tokenizers return token_type_ids and GPT-2 embeds them: a row of the batch
    decodes with what its prompt alone would have (the oracle matrix found --batch dropping them)."""
    kw, _, pads = left_pad(
        [
            {"input_ids": ids(5, 6), "token_type_ids": torch.tensor([[1, 1]])},
            {"input_ids": ids(8), "token_type_ids": torch.tensor([[1]])},
        ],
        pad_id=0,
    )
    assert pads == [0, 1]
    assert kw["token_type_ids"].tolist() == [[1, 1], [0, 1]]
    # an input that is not one value per token, or that a prompt lacks, is not batched
    kw, _, _ = left_pad([{"input_ids": ids(5, 6), "extra": torch.ones(3)}, {"input_ids": ids(8)}], pad_id=0)
    assert set(kw) == {"input_ids", "attention_mask"}


# --- generate_block / _per_input ----------------------------------------------------------------

DECODINGS = [
    {"indices": [2], "steps": 4, "first_bad_step": None, "new_tokens": [[7, 7, 7, 7]]},
    {"indices": [0], "steps": 3, "first_bad_step": 2, "new_tokens": [[1, 2]]},
    {"indices": [1], "steps": 2, "first_bad_step": 1, "new_tokens": [[3]]},
]


def test_generate_block_orders_tokens_by_input_and_keeps_the_first_bad_step_seen():
    block = generate_block(DECODINGS, max_new_tokens=4)
    assert block == {
        "max_new_tokens": 4,
        "steps": 4,
        "first_bad_step": 2,
        "new_tokens": [[1, 2], [3], [7, 7, 7, 7]],
    }


def test_generate_block_of_a_batched_decoding_and_of_none():
    one = [{"indices": [1, 0], "steps": 2, "first_bad_step": None, "new_tokens": [[4, 5], [6, 7]]}]
    assert generate_block(one, 2)["new_tokens"] == [[6, 7], [4, 5]]
    assert generate_block([], 3) == {
        "max_new_tokens": 3,
        "steps": 0,
        "first_bad_step": None,
        "new_tokens": [],
    }


def test_per_input_gives_the_step_only_to_failed_inputs():
    rows = _per_input(DECODINGS, failed=[0])
    assert rows == [
        {"index": 0, "failed": True, "step": 2, "steps": 3},
        {"index": 1, "failed": False, "step": None, "steps": 2},  # its decoding failed, it is not listed
        {"index": 2, "failed": False, "step": None, "steps": 4},
    ]


# --- merge / finish -----------------------------------------------------------------------------


def test_merge_concatenates_decodings_and_unites_prefixes():
    m = GenerateMode(4)
    merged = m.merge(
        [
            {"decodings": DECODINGS[:1], "shortest_failing_prefix": {"0": 3}},
            {"decodings": DECODINGS[1:], "shortest_failing_prefix": {"1": 2}},
            {},
        ]
    )
    assert merged == {"decodings": DECODINGS, "shortest_failing_prefix": {"0": 3, "1": 2}}


def located(step: int, extra: dict) -> Located:
    first = FirstNonfinite(
        input_index=0, module="lm_head", module_type="Linear", op=None, kind="nan", role="producer", step=step
    )
    return Located(first=first, run=None, extra=extra)


def report(n: int, failed: list[int]) -> Report:
    return Report(run=RunInfo(dtype="fp32", device="cpu", n_inputs=n, failed_inputs=failed))


def test_finish_fills_run_generate_from_the_extras_and_the_located_fault():
    p = prepared(nn.Linear(2, 2), [{"input_ids": ids(1)}] * 3)
    rep = report(3, failed=[0, 1])
    # given out of order: input 1 (bad at step 1) first, input 0 (bad at step 2) second
    extra = {
        "decodings": [DECODINGS[2], DECODINGS[0], DECODINGS[1]],
        "shortest_failing_prefix": {"0": 1, "1": 2},
    }
    GenerateMode(4).finish(p, rep, extra, located(2, {"fault_token": {"id": 5, "text": None}}))
    g = rep.run.generate
    assert g["new_tokens"] == [[1, 2], [3], [7, 7, 7, 7]] and g["steps"] == 4
    # decodings sorted by input before the first bad step is taken: input 0's step 2
    assert g["first_bad_step"] == 2
    assert [r["failed"] for r in g["per_input"]] == [True, True, False]
    assert g["shortest_failing_prefix"] == {"0": 1, "1": 2}
    assert g["fault_token"] == {"id": 5, "text": None}
    assert rep.notes == []  # unbatched: every input decoded on its own


def test_finish_of_a_clean_run_has_no_prefix_block():
    p = prepared(nn.Linear(2, 2), [{"input_ids": ids(1)}])
    rep = report(1, failed=[])
    GenerateMode(4).finish(p, rep, {"decodings": DECODINGS[:1], "shortest_failing_prefix": {}}, None)
    assert "shortest_failing_prefix" not in rep.run.generate and rep.run.generate["first_bad_step"] is None


def test_finish_of_a_batched_run_notes_the_inputs_cut_short():
    p = prepared(nn.Linear(2, 2), [{"input_ids": ids(1)}] * 3)
    rep = report(3, failed=[1])
    batch = [{"indices": [0, 1, 2], "steps": 3, "first_bad_step": 2, "new_tokens": [[1, 1], [2, 2], [3, 3]]}]
    GenerateMode(6, batched=True).finish(p, rep, {"decodings": batch}, located(2, {}))
    assert rep.notes == [
        "the batch stopped at step 2: inputs #0, #2 were decoded only up to it; run without "
        "--batch to decode each of them to 6 tokens"
    ]


# --- check_can_generate / pad_token_id / check --------------------------------------------------


class Decoder(nn.Module):
    def __init__(self, can: bool = True):
        super().__init__()
        self.can = can
        self.lin = nn.Linear(2, 2)

    def generate(self, **kw):
        return kw["input_ids"]

    def can_generate(self):
        return self.can


def test_check_can_generate():
    check_can_generate(Decoder())
    with pytest.raises(BadInput, match=r"--generate: Linear has no generate\(\)"):
        check_can_generate(nn.Linear(2, 2))
    with pytest.raises(BadInput, match="Decoder has no generate"):
        check_can_generate(Decoder(can=False))


def test_pad_token_id_without_tokenizer_reads_the_generation_config():
    from transformers import GenerationConfig

    m = Decoder()
    assert pad_token_id(prepared(m, [])) == 0
    m.generation_config = GenerationConfig(pad_token_id=11)
    assert pad_token_id(prepared(m, [])) == 11


def test_check_sets_the_pad_id_and_refuses_inputs_without_one_row_of_ids():
    m = GenerateMode(2)
    m.check(prepared(Decoder(), [{"input_ids": ids(1, 2)}]))
    assert m.pad_id == 0
    with pytest.raises(BadInput, match=r"input #1 \(prompt 1\) has no single row of input_ids"):
        m.check(
            prepared(Decoder(), [{"input_ids": ids(1)}, {"input_ids": torch.ones(2, 3, dtype=torch.long)}])
        )
    with pytest.raises(BadInput, match=r"input #0 \(prompt 0\)"):
        m.check(prepared(Decoder(), [{"x": torch.ones(1, 2)}]))
