"""``locate.first_fault``: the one locate. ``faulted_again``: a step's re-run judged by the one
comparison of recordings against the failing forward."""

from __future__ import annotations

from nan_hunter.capture.records import Call
from nan_hunter.kernels.stats import TensorStats
from nan_hunter.locate.first_fault import faulted_again


def _calls(kinds: list[str | None]) -> tuple[list[Call], list[TensorStats]]:
    calls, rows = [], []
    for i, kind in enumerate(kinds):
        rows.append(TensorStats(numel=4, nan=int(kind == "nan"), posinf=int(kind == "posinf"), absmax=1.0))
        c = Call(i, f"m{i}", "Linear", 0, 1, None, 3, outputs=[("out", i)], seq=i)
        calls.append(c)
    return calls, rows


def test_the_same_fault_again():
    orig, rerun = _calls([None, "posinf", "nan"]), _calls([None, "posinf", "nan"])
    assert faulted_again(*orig, *rerun) is True


def test_a_finite_rerun_or_another_class_is_not_the_fault_again():
    orig = _calls([None, "posinf", "nan"])
    assert faulted_again(*orig, *_calls([None, None, None])) is False
    assert faulted_again(*orig, *_calls([None, "nan", "nan"])) is False


def test_no_fault_recorded_leaves_the_rerun_to_decide():
    assert faulted_again(*_calls([None]), *_calls([None])) is True


# -- the one locate on real recordings --------------------------------------------------------------

import torch  # noqa: E402
from torch import nn  # noqa: E402

from nan_hunter.capture.listener import KeepSteps  # noqa: E402
from nan_hunter.capture.recorder import Recorder  # noqa: E402
from nan_hunter.locate.first_fault import locate  # noqa: E402
from nan_hunter.locate.judged_recording import Recording  # noqa: E402
from nan_hunter.locate.region import BackwardRegion, OptimizerRegion, Region  # noqa: E402
from nan_hunter.locate.rerun import KeptSteps  # noqa: E402
from nan_hunter.locate.training_phases import OptimizerPieces  # noqa: E402

from .test_backward_op import _net  # noqa: E402


class Exp(nn.Module):
    def forward(self, x):
        return torch.exp(x)


class Blocks(nn.Module):
    """Two blocks of (Linear, Exp): a large input overflows the exp of block 0 in fp32."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), Exp()) for _ in range(2))

    def forward(self, x):
        for b in self.layers:
            x = b(x) * 1e-3
        return x


def _recorded(model, inputs, level="modules", backward=False, step=None):
    keep = KeepSteps(model)
    rec = Recorder(model, level=level, retain=len(inputs), backward=backward, listener=keep)
    with rec:
        for x in inputs:
            out = model(x) if step is None else step(x)
    return Recording.of(rec), KeptSteps(rec, keep.contexts, None), out


def test_a_forward_fault_is_located_to_the_leaf_and_op_from_a_block_level_recording():
    m = Blocks()
    rec, rerun, _ = _recorded(m, [torch.randn(2, 4), torch.full((2, 4), 300.0)], level="blocks")
    assert rec.finding.call.module == "layers.0" and rec.failed == [1]  # blocks only: the block
    with rerun.kept():
        loc = locate(rec, rerun)
    f = loc.first
    assert (f.module, f.op, f.kind, f.step, f.reproducible) == (
        "layers.0.1",
        "aten.exp.default",
        "posinf",
        1,
        True,
    )
    assert loc.is_block is False and loc.table and all(r["input_index"] == 1 for r in loc.table)
    assert (
        isinstance(loc.region, Region)
        and loc.region.name == "layers.0.1"
        and loc.region.module is m.layers[0][1]
    )
    assert loc.replay is None and loc.diagnosis is None  # explaining is the assembler's, once


def test_a_forward_whose_inputs_were_not_kept_is_located_from_the_capture_alone():
    m = Blocks()
    rec = Recorder(m, level="modules", retain=1)  # no KeepSteps: nothing kept to re-run from
    with rec:
        m(torch.full((2, 4), 300.0))
    loc = locate(Recording.of(rec), KeptSteps(rec, {}, None))
    assert loc.first.module == "layers.0.1" and loc.first.op is None and loc.first.reproducible is None
    assert loc.region is None and any("were not kept" in n for n in loc.notes)


def test_a_backward_fault_keeps_the_region_for_the_backward_replay():
    m = _net(zero_first=True)  # sqrt at 0: infinite derivative in the backward of SqrtGate

    def step(x):
        m(x).sum().backward()

    rec, rerun, _ = _recorded(m, [torch.ones(2, 4)], backward=True, step=step)
    with rerun.kept():
        loc = locate(rec, rerun)
    assert loc.first.phase == "backward" and loc.first.reproducible is True and loc.first.grad_fn
    assert isinstance(loc.region, BackwardRegion) and loc.region.grads


def test_an_optimizer_fault_is_named_from_the_state_before_the_step():
    m = nn.Linear(4, 4).half()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-8, foreach=False)  # eps is 0 in fp16
    keep = KeepSteps(m)
    rec = Recorder(m, level="modules", retain=1, optimizer=opt, listener=keep)
    weights = {n: p.detach().clone() for n, p in m.named_parameters()}
    with rec:
        m(torch.ones(1, 4, dtype=torch.float16))
        for p in m.parameters():
            p.grad = torch.zeros_like(p)  # zero gradients: 0/0 in the update
        opt.step()
    pieces = OptimizerPieces(
        torch.optim.Adam,
        [{"lr": 1e-3, "eps": 1e-8, "foreach": False}],
        {"weight": 0, "bias": 0},
        weights,
        {n: torch.zeros_like(w) for n, w in weights.items()},
        {},
    )
    recording = Recording.of(rec)
    loc = locate(recording, KeptSteps(rec, keep.contexts, None, optimizer=pieces))
    assert (
        loc.first.phase == "optimizer" and loc.first.op == "aten.addcdiv_.default" and loc.first.reproducible
    )
    assert isinstance(loc.region, OptimizerRegion) and loc.optimizer_facts["optimizer"] == "Adam"
    bare = locate(recording, KeptSteps(rec, keep.contexts, None))  # no pre-step state: no op, and it says why
    assert bare.first.op is None and bare.op_missing in bare.notes
