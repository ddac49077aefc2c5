"""Always on under torchrun (2 ranks, gloo, DDP): a one-time corruption on rank 1 is
``not_reproducible`` naming rank 1 and its device; a plain watch(DDP model) whose weights change
after the fault (optimizer steps) names the leaf and the op; ``on_fault="skip"`` skips the same
step on every rank. Models and batches are test_watch_distributed's; the launch is the same (this
file is the torchrun worker too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_watch_distributed import _batch, _ddp_model, _summary, leave  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _steps(model, opt, steps, rank, bad):
    for step in steps:
        opt.zero_grad()
        model(_batch(step, rank, bad)).float().pow(2).mean().backward()
        opt.step()


def _scenarios(rank: int) -> dict[str, Any]:
    import nan_hunter

    out: dict[str, Any] = {}
    # a value corrupted once on rank 1 (a glitch the re-run does not see): not_reproducible, rank 1
    model, opt = _ddp_model()
    model.module.layers[1].mlp.glitch = rank == 1
    with torch.no_grad(), nan_hunter.watch(model) as w:
        model(_batch(0, rank, {}))
    out["glitch"] = _summary(w.report())

    # plain watch, optimizer steps after an overflow on rank 1 at step 1: leaf and op still named
    model, opt = _ddp_model()
    with nan_hunter.watch(model) as w:
        _steps(model, opt, range(4), rank, {(1, 1): "big"})
    out["weights_changed"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    out["leaf"] = _summary(w.report())

    # on_fault="skip": rank 1's NaN gradients reach rank 0 by the all-reduce; both skip step 1
    model, opt = _ddp_model()
    with nan_hunter.watch(model, backward=True, optimizer=opt, on_fault="skip") as w:
        _steps(model, opt, range(4), rank, {(1, 1): "big"})
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.zeros_like(params) for _ in range(2)]
    torch.distributed.all_gather(everyone, params)
    out["skip_finite"] = bool(torch.isfinite(params).all())
    out["skip_same_on_ranks"] = bool(torch.equal(everyone[0], everyone[1]))
    out["skip"] = _summary(w.report())

    # on_fault="stop" with optimizer=: both ranks leave the loop after step 1 (rank 0 sees the fault
    # only in its all-reduced gradients); a rank that ran on alone would wait in the next all-reduce
    model, opt = _ddp_model()
    stopped_after = None
    with nan_hunter.watch(model, backward=True, optimizer=opt, on_fault="stop") as w:
        for step in range(4):
            _steps(model, opt, [step], rank, {(1, 1): "big"})
            if w.should_stop:
                stopped_after = step
                break
    out["stop_after"] = stopped_after
    out["stop"] = _summary(w.report())

    # FSDP2 (fully_shard, DTensor parameters): the same two
    from test_watch_distributed import Tiny
    from torch.distributed.fsdp import fully_shard

    def sharded():
        torch.manual_seed(0)
        model = Tiny()
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    model, opt = sharded()
    with nan_hunter.watch(model) as w:
        _steps(model, opt, range(4), rank, {(1, 1): "big"})
    out["fsdp_leaf"] = _summary(w.report())
    model, opt = sharded()
    with nan_hunter.watch(model, backward=True, optimizer=opt, on_fault="skip") as w:
        _steps(model, opt, range(4), rank, {(1, 1): "big"})
    out["fsdp_skip_finite"] = all(bool(torch.isfinite(p.full_tensor()).all()) for p in model.parameters())
    out["fsdp_skip"] = _summary(w.report())
    return out


def worker(out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        res = _scenarios(rank)
    except Exception as e:  # noqa: BLE001 - written down for the test to show
        import traceback

        res = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        print(res["trace"], file=sys.stderr, flush=True)
    dist.barrier()
    leave(out_dir, rank, res)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("dist24")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        __file__,
        str(out),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the 2-rank run hung (killed after {e.timeout} s): {str(e.stderr)[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-5000:]
    rs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in rs:
        assert "error" not in r, r.get("trace")
    return rs


def test_one_time_corruption_names_rank_and_device(runs):
    for r in runs:
        g = r["glitch"]
        f = g["first_nonfinite"]
        assert (f["rank"], f["module"], f["reproducible"]) == (1, "layers.1", False)
        d = g["diagnosis"]
        assert d["cause"] == "not_reproducible"
        assert "rank 1" in d["summary"] and "device cpu" in d["summary"]
        assert g["ranks"][0]["first_nonfinite"] is None


def test_plain_watch_names_leaf_and_op_after_optimizer_steps(runs):
    for r in runs:
        assert not r["weights_changed"]  # NaN weights on every rank after the all-reduce
        f = r["leaf"]["first_nonfinite"]
        assert (f["rank"], f["step"], f["module"], f["op"]) == (1, 1, "layers.0.mlp", "aten.exp.default")
        assert f["reproducible"] is True and r["leaf"]["diagnosis"]["cause"] == "overflow"


def test_skip_and_stop_are_the_same_on_every_rank(runs):
    for r in runs:
        assert r["skip_finite"] and r["skip_same_on_ranks"]
        assert r["skip"]["run"]["skipped_steps"] == [1]
        assert r["skip"]["first_nonfinite"]["rank"] == 1
    # stop with optimizer= (v1.3): the rank whose own forward was finite stops at the same step too
    # (it ran on alone and hung in the next all-reduce, waiting for the rank that had stopped)
    for r in runs:
        assert r["stop_after"] == 1
        assert r["stop"]["run"]["skipped_steps"] == [1]


def test_fsdp2_leaf_and_skip(runs):
    for r in runs:
        # the leaf after the weights changed is not named under FSDP2 yet (see the notes): the fault is
        f = r["fsdp_leaf"]["first_nonfinite"]
        assert (f["rank"], f["step"]) == (1, 1) and f["module"].startswith("layers.0")
        assert r["fsdp_skip_finite"]
        assert r["fsdp_skip"]["run"]["skipped_steps"] == [1]


if __name__ == "__main__":
    worker(sys.argv[1])
