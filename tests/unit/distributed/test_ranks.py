"""``nan_hunter.distributed.ranks`` without a process group: the split, torchrun detection, agreement."""

from __future__ import annotations

import pytest

from nan_hunter.distributed import ranks
from nan_hunter.errors import BadInput


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 17])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_share_is_contiguous_ordered_and_complete(n, world):
    parts = [ranks.share(n, r, world) for r in range(world)]
    assert [i for p in parts for i in p] == list(range(n))  # rank order is data-set order
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_launched_needs_torchrun_env(monkeypatch):
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1"}
    for k in env:
        monkeypatch.delenv(k, raising=False)
    assert not ranks.launched() and ranks.writes()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert ranks.launched() and not ranks.writes()  # rank 1 never writes
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not ranks.launched()  # one worker: an ordinary single process
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert not ranks.launched()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR")
    assert not ranks.launched()


def test_single_process_agreement_is_the_identity_or_the_error():
    assert ranks.agree({"x": 1}) == [{"x": 1}]
    assert ranks.finish(1) == 1
    with pytest.raises(BadInput, match="rank 0: bad line"):
        ranks.agree({"error": "bad line", "bad_input": True})
    with pytest.raises(RuntimeError, match="rank 0: ValueError: boom"):
        ranks.agree(ranks._error_payload(ValueError("boom")))
