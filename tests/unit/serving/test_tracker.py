"""``serving.tracker``: a request's trace, and a packed forward run again without some requests."""

from __future__ import annotations

import torch

from nan_hunter.serving.tracker import RequestTrace, _without


def test_a_prefix_needs_every_position():
    t = RequestTrace("req_0", tokens={0: 1, 1: 3, 2: 4})
    assert t.prefix(2) == [1, 3, 4] and t.prefix(1) == [1, 3]
    assert t.prefix(3) is None  # position 3 never seen (a reused prefix): no replay


def test_without_the_faulty_request_keeps_the_others_rows_slots_and_mask(packed_calls):
    """The prefill forward's keywords with req_1 left out: the others' tokens, lengths, logits rows
    and their block of the mask (the re-run itself is held by tests/integration/test_serving.py)."""
    model, calls = packed_calls
    step, kwargs, logits = calls[0]
    import copy

    keep = {"req_0", "req_2"}
    reduced = _without(dict(kwargs), step, keep)
    kept = [r for r in step.requests if r.id in keep]
    assert reduced["input_ids"][0].tolist() == [t for r in kept for t in r.tokens]
    assert reduced["cu_seq_lens_q"].tolist() == [
        0,
        kept[0].stop - kept[0].start,
        sum(r.stop - r.start for r in kept),
    ]
    assert reduced["logits_to_keep"].tolist() == reduced["logits_indices"].tolist()
    assert reduced["attention_mask"].shape[-2:] == (len(reduced["input_ids"][0]),) * 2
    assert _without(dict(kwargs, block_table=torch.zeros(1)), step, keep) is None
    mask = reduced["attention_mask"]
    full = kwargs["attention_mask"]
    rows = [i for r in kept for i in range(r.start, r.stop)]
    assert torch.equal(mask, full[..., rows, :][..., rows])
    assert copy.deepcopy(step) == step


def test_a_packed_forward_whose_logits_stayed_finite_is_traced_to_the_request_that_fails_alone():
    from types import SimpleNamespace

    from models.serving_llama import HOT, serving_llama

    from nan_hunter.serving.packed import PackedRequest, PackedStep
    from nan_hunter.serving.tracker import PackedBatches

    pb = PackedBatches(SimpleNamespace(model=serving_llama("sdpa"), run=None, paused=False))
    pb.requests = {
        "a": RequestTrace("a", tokens={0: 1, 1: 14}),
        "b": RequestTrace("b", tokens={0: 1, 1: HOT}),
    }
    pb.steps = {
        5: PackedStep(
            [PackedRequest("a", 0, 2, [0, 1], [1, 14], [3]), PackedRequest("b", 2, 4, [0, 1], [1, HOT], [4])]
        )
    }
    t = pb.fail_first_alone(5)
    assert t.id == "b" and (t.first_forward, t.position, t.token, t.alone_fails) == (5, 1, HOT, True)
    assert t.blocks_after == {4} and pb.requests["a"].first_forward is None
    assert pb.fail_first_alone(6) is None
