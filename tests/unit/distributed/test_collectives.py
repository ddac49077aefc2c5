"""nan_hunter/distributed/collectives.py: one process (no group, and a group of one), then two gloo
ranks forked from this process (no new interpreter, no torch import: well under a second)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket

import pytest
import torch.distributed as dist

from nan_hunter.distributed import collectives as co


def test_without_a_process_group_everything_is_local():
    assert not dist.is_initialized()
    assert (co.active(), co.rank(), co.world()) == (False, 0, 1)
    assert co.all_gather_json({"a": [1, 2]}) == [{"a": [1, 2]}]
    assert co.broadcast_json("x", 0) == "x"
    co.barrier()  # a no-op, does not hang


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, conn) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        seen = {
            "active": co.active(),
            "rank": co.rank(),
            "world": co.world(),
            # objects of different lengths, non-ASCII text, NaN (allowed: JSON bytes, never pickles)
            "gathered": co.all_gather_json(
                {"r": rank, "text": "é" * (rank * 50), "v": float("nan") if rank else 1.0}
            ),
            "bcast": co.broadcast_json({"from": rank}, 1),
        }
        co.barrier()
        dist.destroy_process_group()
        conn.send(json.dumps(seen))  # a pipe: sent before os._exit, unlike a Queue's feeder thread
    except BaseException as e:  # reported to the test, never a hang
        conn.send(f"error {type(e).__name__}: {e}")
    finally:
        os._exit(0)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")
def test_two_gloo_ranks_gather_and_broadcast_json():
    ctx = mp.get_context("fork")
    port = _free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=_rank_main, args=(r, port, pipes[r][1])) for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    try:
        for r, (recv, _) in enumerate(pipes):
            assert recv.poll(60), f"rank {r} sent nothing within 60 s"
            got[r] = recv.recv()
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for r in range(2):
        assert not got[r].startswith("error"), got[r]
        seen = json.loads(got[r])
        assert (seen["active"], seen["rank"], seen["world"]) == (True, r, 2)
        g = seen["gathered"]
        assert [x["r"] for x in g] == [0, 1] and g[1]["text"] == "é" * 50 and g[0]["v"] == 1.0
        assert g[1]["v"] != g[1]["v"]  # NaN crossed as JSON
        assert seen["bcast"] == {"from": 1}
