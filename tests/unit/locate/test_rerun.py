"""``locate.rerun.KeptSteps``: a step run again from copies of its kept inputs, in the context it
ran in, at the run's precision; never the caller's tensors or state."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from nan_hunter.capture.context import ForwardContext
from nan_hunter.capture.listener import KeepSteps
from nan_hunter.capture.recorder import Recorder
from nan_hunter.dtypes import RunDtype
from nan_hunter.locate.rerun import NO_CONTEXT, KeptSteps


class Mode(nn.Module):
    """Reports what it ran under: grad mode, autocast, train/eval, and a draw from the RNG."""

    def forward(self, x):
        return x / 0, torch.is_grad_enabled(), self.training, torch.rand(1)  # x / 0: the step fails (kept)


def _kept(
    model: nn.Module, x: torch.Tensor, grad: bool, backward: bool = False
) -> tuple[Recorder, KeepSteps]:
    keep = KeepSteps(model)
    rec = Recorder(model, level="modules", retain=2, backward=backward, listener=keep)
    with rec, torch.set_grad_enabled(grad):
        model(x)
    return rec, keep


def test_the_forward_reruns_from_copies_in_the_context_it_ran_in():
    m = Mode().train()
    x = torch.zeros(2)
    torch.manual_seed(7)
    rec, keep = _kept(m, x, grad=False)
    first_draw = torch.rand(1)  # noqa: F841 - the RNG moved on since
    ctx = keep.contexts[0]
    assert isinstance(ctx, ForwardContext) and ctx.grad is False and ctx.training is True
    r = KeptSteps(rec, keep.contexts, None)
    m.eval()  # the model changed mode since: the re-run puts it back as the step had it
    with torch.enable_grad(), r.kept():
        out, grad, training, draw = r.forward(0)()
    assert grad is False and training is True
    assert out is not x and torch.equal(x, torch.zeros(2))  # a copy of the kept input
    torch.manual_seed(7)
    assert torch.equal(draw, torch.rand(1))  # the RNG as the step started: the same draw
    assert not m.training  # kept() restored the mode the model had
    assert r.forward(5) is None and r.context(5) is NO_CONTEXT  # a step not kept


def test_precision_is_the_runs_else_the_autocast_of_the_step_else_the_parameters():
    lin = nn.Linear(2, 2)
    keep = KeepSteps(lin)
    rec = Recorder(lin, level="modules", retain=1, listener=keep)
    with rec, torch.autocast("cpu", dtype=torch.bfloat16):
        lin(torch.ones(1, 2))
    assert KeptSteps(rec, keep.contexts, None).precision(0, "forward").name == "bf16"
    assert KeptSteps(rec, keep.contexts, None).precision(0, "optimizer").name == "fp32"  # no autocast there
    assert KeptSteps(rec, keep.contexts, RunDtype.of("fp16")).precision(0, "forward").name == "fp16"


def test_train_reruns_forward_and_backward_from_the_kept_output_gradients():
    lin = nn.Linear(2, 1)
    keep = KeepSteps(lin)
    rec = Recorder(lin, level="modules", retain=1, backward=True, listener=keep)
    with rec:
        out = lin(torch.ones(1, 2))
        out.backward(torch.full_like(out, float("inf")))  # kept: the step failed in its backward
    r = KeptSteps(rec, keep.contexts, None)
    grads_before = [p.grad.clone() for p in lin.parameters()]
    finite, _ = r.train(0)()
    assert finite is False  # the re-run's gradients are non-finite again
    assert all(
        torch.equal(a, p.grad) for a, p in zip(grads_before, lin.parameters())
    )  # returned, not accumulated


def test_around_whole_and_optimizer_are_what_the_mode_gave():
    lin = nn.Linear(2, 2)
    rec, keep = _kept(lin, torch.ones(1, 2), grad=False)
    seen = []

    @contextlib.contextmanager
    def put(name):
        seen.append(name)
        yield

    r = KeptSteps(rec, keep.contexts, None, around=put, whole=lambda step: (lin, {"input": torch.ones(1, 2)}))
    with r.around("x"):
        pass
    assert seen == ["x"] and r.whole(0)[0] is lin and r.optimizer(0) is None and r.weights(0) is None
    bare = KeptSteps(rec, keep.contexts, None)
    assert bare.whole(0) is None and bare.optimizer_facts(0, "weight") is None
