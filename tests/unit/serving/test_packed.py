"""``serving.packed``: a packed forward's rows mapped to the requests of the real manager."""

from __future__ import annotations

import torch

from nan_hunter.serving.packed import PackedRequest, PackedStep, failed_rows, is_packed, packed_step


def test_prefill_rows_belong_to_their_requests(packed_calls):
    _, calls = packed_calls
    step, kwargs, _ = calls[0]
    by = {r.id: r for r in step.requests}  # in the scheduler's order, which is its own
    assert sorted(by) == ["req_0", "req_1", "req_2"]
    assert sorted(r.stop - r.start for r in step.requests) == [3, 4, 4]
    assert [r.start for r in step.requests] == [0, step.requests[0].stop, step.requests[1].stop]
    assert by["req_1"].tokens == [1, 3, 4, 5] and by["req_1"].positions == [0, 1, 2, 3]
    assert all(r.blocks for r in step.requests) and len({b for r in step.requests for b in r.blocks}) == 3
    assert step.owner(by["req_1"].start + 1).id == "req_1" and step.owner(99) is None
    assert step.rows({"req_2"}) == list(range(by["req_2"].start, by["req_2"].stop))
    assert kwargs["input_ids"][0, by["req_1"].start].item() == 1


def test_decode_rows_and_the_kept_logits_rows(packed_calls):
    _, calls = packed_calls
    step, _, logits = calls[1]
    assert sorted((r.id, r.positions, r.tokens) for r in step.requests) == [
        ("req_0", [4], [13]),
        ("req_1", [4], [6]),
        ("req_2", [3], [13]),
    ]
    assert step.kept_rows == [0, 1, 2] and logits.shape[1] == 3  # the model kept one logits row per request
    assert [step.packed_row(i) for i in failed_rows(logits)] == [0, 1, 2]  # every row poisoned


def test_prefill_logits_are_finite_and_rows_map_through_kept_rows(packed_calls):
    _, calls = packed_calls
    step, _, logits = calls[0]
    assert failed_rows(logits) == []
    assert step.kept_rows == [r.stop - 1 for r in step.requests]  # each request's last row
    assert step.packed_row(1) == step.requests[1].stop - 1


def test_not_packed():
    assert (
        not is_packed({"input_ids": torch.zeros(1, 2)})
        and packed_step({"input_ids": torch.zeros(1, 2)}) is None
    )
    step = PackedStep([PackedRequest("a", 0, 2, [0, 1], [5, 6], [3])])
    assert step.packed_row(1) == 1
    x = torch.zeros(1, 3, 4)
    x[0, 2, 1] = float("nan")
    assert failed_rows(x) == [2]
