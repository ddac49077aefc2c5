"""nan_hunter/locate/position.py: the batch row and token position of a fault."""

from __future__ import annotations

import math

import torch

from nan_hunter.locate.position import first_fault
from nan_hunter.locate.position import token_position as _token_position


def token_position(out, kwargs):
    tp = _token_position(out, kwargs)
    return tp.row, tp.position


def with_bad(shape: tuple[int, ...], at: tuple[int, ...], value: float = math.nan) -> torch.Tensor:
    t = torch.zeros(shape)
    t[at] = value
    return t


def test_first_fault_by_rank_of_the_tensor():
    assert first_fault(with_bad((2, 5, 3), (1, 3, 0))) == (1, 3)
    assert first_fault(with_bad((4, 6), (2, 5), math.inf)) == (2, None)  # no sequence dimension
    assert first_fault(with_bad((6,), (4,), -math.inf)) == (0, None)
    assert first_fault(torch.tensor(math.nan)) == (0, None)


def test_first_fault_is_the_first_bad_element_row_major_and_the_first_bad_tensor():
    t = torch.zeros(3, 4, 2)
    t[2, 0, 0] = math.nan
    t[1, 3, 1] = math.inf
    assert first_fault(t) == (1, 3)
    out = {
        "hidden": torch.zeros(2, 2, 2),
        "logits": with_bad((2, 3, 2), (0, 2, 1)),
        "ids": torch.zeros(2, 2, dtype=torch.long),
    }
    assert first_fault(out) == (0, 2)
    assert first_fault((torch.ones(2, 2), torch.zeros(3))) is None


def test_token_position_without_cache_is_the_column():
    assert token_position(with_bad((1, 5, 2), (0, 3, 1)), {}) == (0, 3)
    assert token_position(with_bad((2, 4), (1, 1)), {}) == (1, None)
    assert token_position(torch.ones(1, 3, 2), {}) == (0, None)  # nothing bad: row 0, no position


def test_token_position_counts_from_cache_position():
    # a decode step: one new token at absolute position 7
    out = with_bad((1, 1, 4), (0, 0, 2))
    assert token_position(out, {"cache_position": torch.tensor([7])}) == (0, 7)
    out = with_bad((1, 3, 4), (0, 2, 0))
    assert token_position(out, {"cache_position": torch.tensor([4, 5, 6])}) == (0, 6)


def test_token_position_adds_the_cache_length_without_cache_position():
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4), layer_idx=0)
    assert cache.get_seq_length() == 5
    assert token_position(with_bad((1, 2, 4), (0, 1, 0)), {"past_key_values": cache}) == (0, 6)


def test_a_cache_this_code_does_not_know_gives_no_position_and_says_why():
    """Never a plausible wrong position (it used to count from 0 here): null, with a note naming
    the library version."""

    class Odd:
        def get_seq_length(self):
            raise NotImplementedError

    for cache in (Odd(), object()):
        tp = _token_position(with_bad((1, 3, 2), (0, 2, 0)), {"past_key_values": cache})
        assert (tp.row, tp.position) == (0, None)
        assert "transformers" in tp.note and type(cache).__name__ in tp.note


def test_position_ids_as_transformers_5_passes_them():
    """transformers 5.24's generate() passes position_ids (left padding already counted out) and a
    ``cache`` object, no cache_position: the README example read position 0 and token <s> there."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.zeros(2, 2, 6, 4), torch.zeros(2, 2, 6, 4), layer_idx=0)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]])
    kw = {"position_ids": torch.tensor([[6], [3]]), "cache": cache, "attention_mask": mask}
    assert token_position(with_bad((2, 1, 4), (1, 0, 0)), kw) == (1, 3)  # not 6 - 3 = 3 twice over
    assert token_position(with_bad((2, 1, 4), (0, 0, 0)), kw) == (0, 6)
    tp = _token_position(with_bad((2, 1, 4), (0, 0, 0)), kw)
    assert tp.source == "position_ids" and tp.note is None
    # the prompt's forward: one row of position ids shared by the batch
    assert token_position(with_bad((1, 5, 2), (0, 4, 1)), {"position_ids": torch.arange(5)[None]}) == (0, 4)


def test_the_cache_under_its_5x_name_and_the_legacy_tuple_format():
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4), layer_idx=0)
    assert token_position(with_bad((1, 1, 4), (0, 0, 0)), {"cache": cache}) == (0, 5)
    legacy = ((torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)),)
    assert token_position(with_bad((1, 1, 4), (0, 0, 0)), {"past_key_values": legacy}) == (0, 4)


def test_token_position_subtracts_the_rows_left_padding():
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    out = with_bad((2, 4, 2), (1, 3, 0))
    assert token_position(out, {"attention_mask": mask}) == (1, 1)  # 3 in the batch, 1 in its own tokens
    out = with_bad((2, 4, 2), (0, 3, 0))
    assert token_position(out, {"attention_mask": mask}) == (0, 3)
    # a decode step of row 1: absolute 4 minus its 2 pads
    mask5 = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    out = with_bad((2, 1, 2), (1, 0, 1))
    assert token_position(out, {"attention_mask": mask5, "cache_position": torch.tensor([4])}) == (1, 2)
