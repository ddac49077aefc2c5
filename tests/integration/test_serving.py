"""A watch around transformers' continuous batching (``generate_batch``: the real
``ContinuousBatchingManager``, packed forwards, paged KV cache) on a tiny fp16 Llama on CPU
(``tests/models/serving_llama.py``): per-request attribution (contract v1.4, "Serving: packed
batches"), ``on_fault="abort"``, a fault in a weight every request reads, a poisoned prefix, and
``report()`` returning promptly however large the paged cache is."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("transformers.generation.continuous_batching")

from models.serving_llama import HOT, cb_config, greedy, serving_llama  # noqa: E402

import nan_hunter  # noqa: E402

#: eight prompts; the second counts 3 4 5 → "6", read at decode step 1 (position 4): +inf in layer 0
PROMPTS = [
    [1, 14, 15, 16],
    [1, 3, 4, 5],
    [1, 20, 21],
    [1, 8, 9],
    [1, 17],
    [1, 22, 23, 24, 25],
    [1, 10],
    [1, 27, 28],
]
BAD = "req_1"


def _generate(model, prompts, new=4, logprobs=False, **cfg):
    out = model.generate_batch(
        prompts,
        generation_config=greedy(new),
        continuous_batching_config=cb_config(return_logprobs=logprobs, **cfg),
        progress_bar=False,
    )
    if logprobs:
        return {
            k: (list(v.generated_tokens), v.error, [float(x) for x in v.logprobs]) for k, v in out.items()
        }
    return {k: (list(v.generated_tokens), v.error) for k, v in out.items()}


@pytest.fixture(scope="module")
def model():
    return serving_llama("sdpa")


def test_the_fault_poisons_every_request_packed_with_it(model):
    """The measured bug, without nanhunter: the clean requests' tokens turn to 0 (NaN logits
    through the packed attention), though each is finite alone."""
    out = _generate(model, PROMPTS)
    assert out[BAD][0][:1] == [HOT]
    assert all(toks[1:] == [0, 0, 0] for rid, (toks, _) in out.items())
    alone = _generate(model, [PROMPTS[0]])
    assert alone["req_0"][0] == [13, 13, 13, 13]


def test_requests_name_the_origin_and_the_poisoned(model):
    plain = _generate(model, PROMPTS)
    with nan_hunter.watch(model) as w:
        watched = _generate(model, PROMPTS)
    assert watched == plain  # record: the outputs are the model's, bitwise
    r = w.report()
    reqs = {q.id: q for q in r.run.requests}
    assert sorted(reqs) == [f"req_{i}" for i in range(8)]
    bad = reqs[BAD]
    assert (bad.failed, bad.origin, bad.poisoned_by) == (True, True, None)
    assert (bad.step, bad.position, bad.token) == (1, 4, {"id": HOT, "text": None})
    assert (bad.module, bad.op, bad.cause) == ("model.layers.0", "aten.add.Tensor", "overflow")
    for rid, q in reqs.items():
        if rid != BAD:
            assert (q.failed, q.origin, q.poisoned_by, q.module) == (True, False, BAD, None), q
    # the report's location is the origin's, replayed alone: its own position, its own step
    f = r.first_nonfinite
    assert (f.module, f.op, f.position, f.reproducible) == ("model.layers.0", "aten.add.Tensor", 4, True)
    assert r.diagnosis.cause == "overflow"
    evict = {e.request: e for e in r.run.evict}
    assert evict[BAD].blocks
    assert r["run"]["requests"][1]["id"] == BAD  # JSON: the typed fields as keys
    assert any("req_1 is the origin" in n for n in r.notes)


def test_abort_ends_the_faulty_request_and_serves_the_rest_bitwise(model):
    without = _generate(model, [p for i, p in enumerate(PROMPTS) if i != 1], logprobs=True)
    with nan_hunter.watch(model, on_fault="abort") as w:
        got = _generate(model, PROMPTS, logprobs=True)
    toks, err, _ = got[BAD]
    assert err is not None and "overflow" in err and "model.layers.0" in err and "aborted" in err
    others = [got[f"req_{i}"] for i in range(8) if i != 1]
    assert [o[1] for o in others] == [None] * 7
    assert [o[0] for o in others] == [without[f"req_{i}"][0] for i in range(7)]
    assert [o[2] for o in others] == [
        without[f"req_{i}"][2] for i in range(7)
    ]  # log-probabilities too, bitwise
    r = w.report()
    assert r.run.on_fault == "abort"
    assert [e.request for e in r.run.evict] == [BAD]  # the others' KV was rewritten by the re-run
    assert model.init_continuous_batching.__func__ is type(model).init_continuous_batching  # the wrap is gone
    assert not model._forward_hooks and not model._forward_pre_hooks  # and the hooks


def test_a_fault_in_a_weight_every_request_reads_is_not_blamed_on_one():
    model = serving_llama("sdpa", shared_fault=True)
    prompts = [[1, 14, 15], [1, 20, 21], [1, 17]]
    with nan_hunter.watch(model) as w:
        _generate(model, prompts, new=2)
    r = w.report()
    reqs = r.run.requests
    assert len(reqs) == 3 and all(q.failed and q.origin and q.poisoned_by is None for q in reqs)
    assert {q.module for q in reqs} == {r.first_nonfinite.module}
    assert "lm_head" in r.first_nonfinite.module
    assert any("shared by all requests" in n for n in r.notes)
    assert not any(" is the origin" in n for n in r.notes)
    with nan_hunter.watch(model, on_fault="abort"):
        got = _generate(model, prompts, new=2)
    assert all(err is not None and "a weight every request reads (lm_head)" in err for _, err in got.values())


def test_a_poisoned_prefix_is_listed_for_eviction_and_dropped_on_abort(model):
    """A's prompt holds the hot token in its first full page (16 tokens): that block is complete,
    hashed and cached by the manager's prefix cache; B, a later request starting with the same 16
    tokens, reuses it. The report lists the block and its prefix hash; under abort A's blocks go back
    without their hash, so B computes its own."""
    head = [1, 14, 15, HOT] + list(range(17, 29))  # 16 tokens
    a, b = head + [29, 30], head + [31]
    cfg = dict(persistent_manager=True)
    try:
        with nan_hunter.watch(model) as w:
            model.generate_batch(
                [a], generation_config=greedy(2), continuous_batching_config=cb_config(), **cfg
            )
            model.generate_batch(
                [b], generation_config=greedy(2), continuous_batching_config=cb_config(), **cfg
            )
        r = w.report()
        reqs = {q.id: q for q in r.run.requests}
        assert reqs["req_0"].origin and reqs["req_1"].origin  # both prompts hold the hot token
        assert not any("shared by all requests" in n for n in r.notes)
        evict = {e.request: e for e in r.run.evict}
        a_out = evict["req_0"]
        assert a_out.prefixes  # the complete first block, hashed by the prefix cache
        manager = model._cached_continuous_batching_manager
        ledger = next(iter(manager.batch_processor.cache.cache_allocators.values())).ledger
        hashed = [blk for blk in a_out.blocks if blk in ledger.block_to_hash]
        assert hashed and [f"{ledger.block_to_hash[blk]:#x}" for blk in hashed] == a_out.prefixes
        # B matched A's hashed block instead of computing its own: what eviction prevents
        assert hashed[0] not in evict["req_1"].blocks
    finally:
        model.destroy_cached_continuous_batching_manager()
    try:
        with nan_hunter.watch(model, on_fault="abort"):
            model.generate_batch(
                [a], generation_config=greedy(2), continuous_batching_config=cb_config(), **cfg
            )
            manager = model._cached_continuous_batching_manager
            ledger = next(iter(manager.batch_processor.cache.cache_allocators.values())).ledger
            assert ledger.hash_to_block == {}  # nothing of A's is left to match
    finally:
        model.destroy_cached_continuous_batching_manager()


def test_report_after_a_packed_fault_is_prompt_however_large_the_cache():
    """Before: a packed forward's kept inputs held the whole paged cache, copied, cast and scanned
    by every re-run: this very case (a 134 MB cache) took 124 s on this machine, 30 s at 32 MB,
    and did not return within 170 s at the sizes the issue measured. Now the origin request is
    replayed alone (3–4 s here), and the cache is not kept."""
    model = serving_llama("sdpa")
    with nan_hunter.watch(model) as w:
        _generate(model, PROMPTS[:2], new=2, page_size=256, num_blocks=2048, max_batch_tokens=512)
    t = time.perf_counter()
    r = w.report()
    took = time.perf_counter() - t
    assert r.first_nonfinite.module == "model.layers.0" and r.diagnosis.cause == "overflow"
    assert took < 30, took
    kept = [s for _, s in w.retained]
    assert all("cache" not in s.kwargs for s in kept)


@pytest.mark.parametrize("attn", ["paged|eager"])
def test_paged_eager_names_the_same_origin(attn):
    model = serving_llama(attn)
    with nan_hunter.watch(model) as w:
        _generate(model, PROMPTS[:3], new=3)
    r = w.report()
    reqs = {q.id: q for q in r.run.requests}
    assert reqs[BAD].origin and reqs[BAD].cause == "overflow"
    assert reqs["req_0"].poisoned_by == BAD
