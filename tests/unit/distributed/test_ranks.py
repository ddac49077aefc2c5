"""``nan_hunter.distributed.ranks`` without a process group: the split, torchrun detection, agreement."""

from __future__ import annotations

import pytest

from nan_hunter.distributed import ranks as rank_split
from nan_hunter.errors import BadInput


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 17])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_share_is_contiguous_ordered_and_complete(n, world):
    parts = [rank_split.share(n, r, world) for r in range(world)]
    assert [i for p in parts for i in p] == list(range(n))  # rank order is data-set order
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_launched_needs_torchrun_env(monkeypatch):
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1"}
    for k in env:
        monkeypatch.delenv(k, raising=False)
    assert not rank_split.launched() and rank_split.writes()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert rank_split.launched() and not rank_split.writes()  # rank 1 never writes
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not rank_split.launched()  # one worker: an ordinary single process
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert not rank_split.launched()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR")
    assert not rank_split.launched()


def test_single_process_agreement_is_the_identity_or_the_error():
    assert rank_split.agree({"x": 1}) == [{"x": 1}]
    assert rank_split.finish(1) == 1
    with pytest.raises(BadInput, match="rank 0: bad line"):
        rank_split.agree({"error": "bad line", "bad_input": True})
    with pytest.raises(RuntimeError, match="rank 0: ValueError: boom"):
        rank_split.agree(rank_split._error_payload(ValueError("boom")))


