"""``watch()`` under torchrun: real 2-rank runs (gloo on CPU) of DDP and FSDP2 models.

One ``torchrun --nproc-per-node 2`` launch runs every scenario (this file is also the worker:
``python -m torch.distributed.run ... test_watch_distributed.py OUT_DIR``); each rank writes what
it saw to ``OUT_DIR/rank<k>.json`` and the tests below read those. Collectives are counted with
the profiler (every gloo collective records a ``gloo:<name>`` event), so "capture adds no
collective per forward" is measured, not assumed. A hang fails the launch's timeout.
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
NAN = float("nan")


# -- the models ---------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)
        self.glitch = False  # emit one NaN on the next call only: a fault that does not come back
        self.safe_log = False  # log of the positive part via where(): NaN gradients at exact zeros

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.safe_log:
            h = h * (x[..., :1] != 0)  # rows whose first feature is 0 are switched off
            h = torch.where(h > 0, torch.log(h), torch.zeros_like(h))  # finite; its backward is 0/0 at 0
        h = torch.exp(h)  # overflows to inf for large inputs
        if self.glitch:
            self.glitch = False
            h = h.clone()
            h.view(-1)[0] = NAN
        return self.fc2(h)


class Block(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class Tiny(nn.Module):
    def __init__(self, width: int = 8, n: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(Block(width) for _ in range(n))
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


# -- the worker (runs under torchrun) ----------------------------------------------------------
def _collectives(fn: Any) -> dict[str, int]:
    """The gloo collectives ``fn()`` issued on this rank, by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return dict(collections.Counter(e.name for e in prof.events() if e.name.startswith("gloo:")))


def _summary(rep: Any) -> dict[str, Any]:
    d = rep.to_dict()
    return {k: d[k] for k in ("first_nonfinite", "ranks", "failed_inputs", "notes", "diagnosis", "run")}


def _batch(step: int, rank: int, bad: dict[tuple[int, int], str]) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.rand(4, 8, generator=g)
    what = bad.get((step, rank))
    if what == "nan":
        x[1, 3] = NAN
    elif what == "big":
        x = x * 1e4  # exp(fc1(x)) overflows in layers.0.mlp
    elif what == "zero_row":
        x[0, 0] = 0.0
    return x


def _ddp_steps(
    model: nn.Module, opt: torch.optim.Optimizer, steps: range, rank: int, bad: dict[tuple[int, int], str]
) -> None:
    for step in steps:
        opt.zero_grad()
        model(_batch(step, rank, bad)).float().pow(2).mean().backward()
        opt.step()


def _ddp_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(Tiny())
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def _ddp(rank: int) -> dict[str, Any]:
    import nan_hunter

    out: dict[str, Any] = {}
    # no collective per forward: the same steps, plain and watched (the report is apart)
    model, opt = _ddp_model()
    _ddp_steps(model, opt, range(2), rank, {})  # DDP rebuilds its buckets (a broadcast) early on
    out["plain"] = _collectives(lambda: _ddp_steps(model, opt, range(3), rank, {}))
    w = nan_hunter.watch(model)
    out["watched"] = _collectives(
        lambda: (w.__enter__(), _ddp_steps(model, opt, range(3), rank, {}), w.__exit__(None, None, None))
    )
    out["clean"] = _summary(w.report())
    out["report_collectives"] = _collectives(w.report)
    from nan_hunter.session.watcher import Watch

    with torch.no_grad(), Watch(model) as own:  # the CLI's own watches (a rank's share of --generate)
        model(_batch(9, rank, {(9, 1): "nan"}))
    out["per_rank"] = {"collectives": _collectives(own.report), "report": _summary(own.report())}

    # a NaN batch on rank 1 at step 1: both ranks name rank 1 (role input)
    model, opt = _ddp_model()
    with nan_hunter.watch(model) as w:
        _ddp_steps(model, opt, range(3), rank, {(1, 1): "nan"})
    out["nan_batch"] = _summary(w.report())

    # an overflow on rank 1 at step 0 and on rank 0 at step 1: the earliest step wins (forwards
    # only: after an optimizer step a report cannot re-run a forward at module and op level)
    model, opt = _ddp_model()
    with torch.no_grad(), nan_hunter.watch(model) as w:
        for i in range(2):
            model(_batch(i, rank, {(0, 1): "big", (1, 0): "big"}))
    out["overflow"] = _summary(w.report())

    # the same fault on both ranks in the same step: the lowest rank
    model, opt = _ddp_model()
    with torch.no_grad(), nan_hunter.watch(model) as w:
        model(_batch(0, rank, {(0, 0): "big", (0, 1): "big"}))
    out["tie"] = _summary(w.report())

    # a fault that is not there when rank 1 re-runs its forward (a glitch): a note names the rank
    model, _ = _ddp_model()
    model.module.layers[1].mlp.glitch = rank == 1
    with torch.no_grad(), nan_hunter.watch(model) as w:
        model(_batch(0, rank, {}))
    out["glitch"] = _summary(w.report())

    # backward capture (when this build has it): a finite forward whose backward is NaN on rank 1
    # only; after the all-reduce every rank's gradients are NaN, the fault is named on rank 1
    if "backward" in inspect.signature(Watch.__init__).parameters:
        model, opt = _ddp_model()
        model.module.layers[0].mlp.safe_log = True
        with nan_hunter.watch(model, backward=True) as w:
            _ddp_steps(model, opt, range(1), rank, {(0, 1): "zero_row"})
        out["grads_nan"] = all(
            bool(torch.isnan(p.grad).any()) for p in model.module.layers[0].mlp.fc1.parameters()
        )
        out["backward"] = _summary(w.report())
    return out


def _fsdp(rank: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    import nan_hunter
    from nan_hunter.capture.recorder import Recorder

    out: dict[str, Any] = {}
    torch.manual_seed(0)
    model = Tiny()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    p = model.get_parameter("layers.1.mlp.fc1.weight")
    out["sharded"] = [type(p).__name__, list(p.to_local().shape)]

    def step(i: int) -> None:
        opt.zero_grad()
        model(_batch(i, rank, {})).pow(2).mean().backward()
        opt.step()

    out["plain"] = _collectives(lambda: [step(i) for i in range(2)])
    w = nan_hunter.watch(model, level="modules")
    out["watched"] = _collectives(
        lambda: (w.__enter__(), [step(i) for i in range(2)], w.__exit__(None, None, None))
    )
    out["clean"] = _summary(w.report())

    # measuring DTensor parameters directly (their local shards) issues no collective
    rec = Recorder(model, level="modules")
    params = [(n, q.detach()) for n, q in model.named_parameters()]
    out["measure_dtensors"] = _collectives(lambda: rec._measure_all((dict(params), "")))
    out["measured_shapes"] = [rec.sink.rows()[r].numel for _, r in rec._measure_all((dict(params), ""))][:2]

    # a backward fault on rank 1 only that shows in parameter gradients (layer 0's input needs no
    # grad): autograd accumulates into FSDP's gathered parameters, which the watch hooks as calls see them
    torch.manual_seed(0)
    bmodel = Tiny()
    bmodel.layers[0].mlp.safe_log = True
    for layer in bmodel.layers:
        fully_shard(layer)
    fully_shard(bmodel)
    with nan_hunter.watch(bmodel, level="modules", backward=True) as w:
        bmodel(_batch(0, rank, {(0, 1): "zero_row"})).pow(2).mean().backward()
    out["backward"] = _summary(w.report())

    # a NaN in rank 1's shard of layers.1.mlp.fc1.weight (rows 4..7 of the full weight)
    with torch.no_grad():
        if rank == 1:
            p.to_local()[1, 2] = NAN
    with torch.no_grad(), nan_hunter.watch(model) as w:
        model(_batch(5, rank, {}))
    out["weights"] = _summary(w.report())
    out["after_report"] = _collectives(
        lambda: model(_batch(6, rank, {})).sum().backward()
    )  # still trains, no hang
    return out


def leave(out_dir: str, rank: int, res: dict[str, Any]) -> None:
    """A torchrun worker's end: its results written, the process group destroyed, then the process left
    without the interpreter's teardown, where gloo's worker threads can abort it (std::terminate,
    "terminate called without an active exception": once in a loaded CI run, after both ranks' skips).
    A crash after the "results written" line is teardown's; one before it still fails the run."""
    import torch.distributed as dist

    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(res, default=str))
    print(f"rank {rank}: results written", file=sys.stderr, flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def worker(out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    res: dict[str, Any] = {"rank": rank, "world": dist.get_world_size()}
    for name, fn in (("ddp", _ddp), ("fsdp", _fsdp)):
        try:
            res[name] = fn(rank)
        except Exception as e:  # noqa: BLE001 - written down for the test to show
            import traceback

            res[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        dist.barrier()
    leave(out_dir, rank, res)


# -- the tests -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("dist")
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
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _ok(runs: list[dict[str, Any]], part: str) -> list[dict[str, Any]]:
    for r in runs:
        assert "error" not in r[part], r[part].get("trace")
    return [r[part] for r in runs]


def test_ddp_capture_adds_no_collective(runs):
    for r in _ok(runs, "ddp"):
        assert r["plain"] and r["watched"] == r["plain"]  # DDP's own all-reduces only
        assert r["clean"]["first_nonfinite"] is None
        assert [x["first_nonfinite"] for x in r["clean"]["ranks"]] == [None, None]
        assert r["report_collectives"]  # report() is the collective
        assert r["per_rank"]["collectives"] == {} and r["per_rank"]["report"]["ranks"] is None
    own = [r["ddp"]["per_rank"]["report"]["first_nonfinite"] for r in runs]
    assert own[0] is None and own[1]["role"] == "input"  # each rank its own answer


def test_ddp_nan_batch_on_rank_1(runs):
    answers = [r["nan_batch"] for r in _ok(runs, "ddp")]
    assert answers[0]["first_nonfinite"] == answers[1]["first_nonfinite"]  # one global answer
    f = answers[0]["first_nonfinite"]
    assert (f["rank"], f["step"], f["role"], f["kind"]) == (1, 1, "input", "nan")
    assert f["module"] == "layers.0"  # the unwrapped model's name, not module.layers.0
    for a in answers:
        assert [x["rank"] for x in a["ranks"]] == [0, 1]
        assert a["ranks"][1]["first_nonfinite"]["module"] == "layers.0"
        assert a["ranks"][1]["failed_inputs"] == [1, 2]
        # the all-reduce carried rank 1's NaN gradients into every rank's weights at step 1's update
        assert (a["ranks"][0]["first_nonfinite"]["step"], a["ranks"][0]["first_nonfinite"]["role"]) == (
            2,
            "weights",
        )
        assert a["failed_inputs"] == [1, 2]
        # the weights of the failing forward are kept at the fault (contract v1.2): no "changed in place" note
        assert not any(
            n.startswith("rank 1: parameters changed in place after forward 1") for n in a["notes"]
        )


def test_ddp_earliest_step_wins(runs):
    answers = [r["overflow"] for r in _ok(runs, "ddp")]
    for a in answers:
        f = a["first_nonfinite"]
        assert (f["rank"], f["step"], f["module"], f["role"], f["kind"]) == (
            1,
            0,
            "layers.0.mlp",
            "producer",
            "posinf",
        )
        assert f["op"] == "aten.exp.default"
        assert a["ranks"][0]["first_nonfinite"]["step"] == 1
        assert a["diagnosis"]["cause"] == "overflow"  # rank 1's diagnosis, on rank 0 too
        assert a["run"]["failed_inputs"] == [0]  # rank 1's run
    assert answers[0] == answers[1]


def test_ddp_same_step_same_module_lowest_rank(runs):
    for r in _ok(runs, "ddp"):
        f = r["tie"]["first_nonfinite"]
        assert (f["rank"], f["module"]) == (0, "layers.0.mlp")
        assert r["tie"]["ranks"][1]["first_nonfinite"]["module"] == "layers.0.mlp"


def test_ddp_fault_that_does_not_come_back_is_pinned_on_its_rank(runs):
    for r in _ok(runs, "ddp"):
        g = r["glitch"]
        assert g["first_nonfinite"]["rank"] == 1
        assert g["first_nonfinite"]["module"] == "layers.1"  # from the capture alone
        assert any(n.startswith("rank 1:") and "non-determinism" in n and "hardware" in n for n in g["notes"])


def test_ddp_backward_fault_named_on_its_rank(runs):
    rs = _ok(runs, "ddp")
    if "backward" not in rs[0]:
        pytest.skip("this build's watch() has no backward capture yet")
    for r in rs:
        assert r["grads_nan"]  # after the all-reduce every rank's gradients are NaN
        f = r["backward"]["first_nonfinite"]
        assert (f["rank"], f["phase"], f["step"], f["module"]) == (1, "backward", 0, "layers.0.mlp")
        assert f["grad_fn"] == "LogBackward0" and f["op"] == "aten.div.Tensor"
        assert r["backward"]["diagnosis"]["cause"] == "division_by_zero"
        assert r["backward"]["ranks"][0]["first_nonfinite"] is None  # rank 0's own backward was finite


def test_fsdp2_capture_adds_no_collective(runs):
    for r in _ok(runs, "fsdp"):
        assert r["sharded"] == ["DTensor", [4, 8]]
        assert r["plain"] and r["watched"] == r["plain"]  # FSDP's own all-gathers and reduce-scatters
        assert r["clean"]["first_nonfinite"] is None
        assert r["measure_dtensors"] == {}  # DTensors measured on the local shard
        assert r["measured_shapes"] == [32, 4]  # layers.0.mlp.fc1 weight (4 x 8 of 8 x 8) and bias


def test_fsdp2_nan_in_one_shard_names_the_full_parameter_and_its_rank(runs):
    answers = [r["weights"] for r in _ok(runs, "fsdp")]
    assert answers[0]["first_nonfinite"] == answers[1]["first_nonfinite"]
    f = answers[0]["first_nonfinite"]
    assert f["role"] == "weights" and f["kind"] == "nan"
    assert f["param"] == "layers.1.mlp.fc1.weight"
    assert f["module"] == "layers.1.mlp.fc1"
    assert f["rank"] == 1  # the rank whose shard holds it, though every rank saw the gathered NaN
    assert [x["first_nonfinite"]["module"] for x in answers[0]["ranks"]] == ["layers.1.mlp.fc1"] * 2
    assert answers[0]["diagnosis"]["cause"] == "nonfinite_weights"
    for r in _ok(runs, "fsdp"):
        assert r["after_report"]  # FSDP's collectives of the next step ran: hooks and shards restored


if __name__ == "__main__":
    worker(sys.argv[1])


def test_fsdp2_backward_fault_in_parameter_gradients_named_on_its_rank(runs):
    for r in _ok(runs, "fsdp"):
        f = r["backward"]["first_nonfinite"]
        assert (f["rank"], f["phase"], f["step"], f["module"]) == (1, "backward", 0, "layers.0.mlp")
        assert f["grad_fn"] == "LogBackward0" and f["op"] == "aten.div.Tensor"
        assert r["backward"]["diagnosis"]["cause"] == "division_by_zero"
