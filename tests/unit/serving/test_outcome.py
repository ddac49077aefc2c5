"""``serving.outcome``: origin, poisoned and shared-weight verdicts from traces of requests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nan_hunter.report import Report, RunInfo
from nan_hunter.serving import outcome
from nan_hunter.serving.packed import PackedRequest, PackedStep
from nan_hunter.serving.tracker import PackedBatches, RequestTrace


@pytest.fixture(scope="module")
def model():
    from models.serving_llama import serving_llama

    return serving_llama("sdpa")


def _batches(model, traces, steps=None):
    pb = PackedBatches(SimpleNamespace(model=model, run=None, paused=False))
    pb.requests = {t.id: t for t in traces}
    pb.steps = steps or {}
    return pb


def _failed(rid, tokens, forward=1, blocks=(7,)):
    return RequestTrace(
        rid,
        tokens=dict(enumerate(tokens)),
        steps=2,
        first_forward=forward,
        decode_step=1,
        position=len(tokens) - 1,
        token=tokens[-1],
        blocks_after=set(blocks),
    )


def test_origin_poisoned_and_finite(model):
    from models.serving_llama import HOT

    traces = [
        _failed("req_10", [1, 14, 15, 13], blocks=(8,)),
        _failed("req_2", [1, 3, 4, 5, HOT]),
        RequestTrace("req_3", tokens={0: 1}, steps=2),
    ]
    step = PackedStep(
        [PackedRequest("req_10", 0, 1, [3], [13], [8]), PackedRequest("req_2", 1, 2, [4], [HOT], [7])]
    )
    pb = _batches(model, traces, {1: step})
    assert outcome.first_origin(pb).id == "req_2"
    rec = SimpleNamespace(finding=SimpleNamespace(role="producer", call=SimpleNamespace(input_index=1)))
    assert not outcome.shared_weight(pb, rec)
    rep = Report(run=RunInfo(dtype="fp16", device="cpu", n_inputs=2))
    outcome.finish(pb, rep, rec)
    assert [q.id for q in rep.run.requests] == ["req_2", "req_3", "req_10"]  # req_2 before req_10
    by = {q.id: q for q in rep.run.requests}
    assert (by["req_2"].origin, by["req_10"].origin, by["req_10"].poisoned_by) == (True, False, "req_2")
    assert not by["req_3"].failed and by["req_3"].step is None
    assert {e.request: e.blocks for e in rep.run.evict} == {"req_10": [8], "req_2": [7]}
    pb.abort = True  # under abort the others were re-run: only the origin's blocks stay poisoned
    outcome.finish(pb, rep, rec)
    assert [e.request for e in rep.run.evict] == ["req_2"]
    pb.packed = {1}
    rerun = outcome.origin_rerun(pb, rec, SimpleNamespace(model=model, run=None))
    assert rerun.tokens == [1, 3, 4, 5, HOT] and rerun.step == 1
    other = SimpleNamespace(finding=SimpleNamespace(role="producer", call=SimpleNamespace(input_index=0)))
    assert outcome.origin_rerun(pb, other, "base") == "base"  # forward 0 was not a packed batch


def test_a_packed_fault_no_request_owns_is_not_rerun(model):
    pb = _batches(model, [RequestTrace("req_0", tokens={0: 1}, steps=1)])
    pb.packed = {2}
    rec = SimpleNamespace(finding=SimpleNamespace(role="producer", call=SimpleNamespace(input_index=2)))
    rerun = outcome.origin_rerun(pb, rec, SimpleNamespace(model=model, run=None))
    assert rerun.inputs(2) is None and rerun.forward(2) is None
    assert any("no request of it fails alone" in n for n in pb.notes)


def test_a_weight_fault_is_shared(model):
    rec = SimpleNamespace(finding=SimpleNamespace(role="weights", call=SimpleNamespace(input_index=0)))
    pb = _batches(model, [_failed("req_0", [1, 14])])
    assert outcome.shared_weight(pb, rec)
    assert outcome.origin_rerun(_batches(model, []), rec, "base") == "base"  # no packed forward seen


def test_token_text_from_the_checkpoint_tokenizer(tmp_path):
    """A model loaded from a directory holding its tokenizer: the failing token's text is decoded;
    without one it is null (the watch is given a model, not a tokenizer)."""
    from models.serving_llama import HOT, VOCAB, serving_llama
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    model = serving_llama("sdpa")
    traces = [_failed("req_0", [1, 3, 4, 5, HOT])]
    rec = SimpleNamespace(finding=SimpleNamespace(role="producer", call=SimpleNamespace(input_index=1)))
    rep = Report(run=RunInfo(dtype="fp16", device="cpu", n_inputs=1))
    outcome.finish(_batches(model, traces), rep, rec)
    assert rep.run.requests[0].token == {"id": HOT, "text": None}
    words = Tokenizer(WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0").save_pretrained(tmp_path)
    model.config.save_pretrained(tmp_path)
    model.config._name_or_path = str(tmp_path)
    outcome.finish(_batches(model, traces), rep, rec)
    assert rep.run.requests[0].token == {"id": HOT, "text": f"w{HOT}"}
    assert outcome.tokenizer_of(SimpleNamespace(config=SimpleNamespace(_name_or_path="org/not-here"))) is None
