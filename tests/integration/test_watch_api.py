"""nan_hunter.watch in a user's own loop: bitwise-equal outputs, hooks removed, levels agree."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nan_hunter


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x, scale: float = 1.0):
        for layer in self.layers:
            x = x + layer(x) * scale
        return {"logits": self.head(x), "hidden": (x, None), "ids": torch.arange(3)}


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("level", ["blocks", "modules", "ops"])
def test_outputs_bitwise_equal_and_hooks_removed(level):
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        plain = model(x)
        with nan_hunter.watch(model, level=level) as w:
            watched = model(x)
    assert torch.equal(plain["logits"], watched["logits"])
    assert torch.equal(plain["hidden"][0], watched["hidden"][0])
    assert _hooks(model) == 0
    assert w.report().first_nonfinite is None


def test_hooks_removed_when_forward_raises():
    model = Net()
    with pytest.raises(RuntimeError):
        with nan_hunter.watch(model, level="modules"):
            model(torch.randn(4, 5))  # wrong width
    assert _hooks(model) == 0


@pytest.mark.parametrize("level", ["blocks", "modules"])
def test_levels_give_the_same_report(level):
    torch.manual_seed(0)
    model = Net().eval()
    with torch.no_grad():
        model.layers[1][0].weight.mul_(1e4)
    model = model.half()
    x = torch.randn(4, 8).half() * 10
    with torch.no_grad(), nan_hunter.watch(model, level=level) as w:
        for _ in range(2):
            model(x, scale=1.0)
    r = w.report()
    f = r.first_nonfinite
    assert f is not None
    assert f.module == "layers.1.0" and f.module_type == "Linear"
    assert f.op in ("aten.addmm.default", "aten.mm.default")
    assert f.role == "producer" and f.kind in ("posinf", "neginf")
    assert r.failed_inputs == [0, 1]


def test_module_called_several_times_reports_call_index():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            return self.lin(y * 3e3)  # 24000 fits fp16; 4 x 24000 does not

    m = Shared().half().eval()
    with torch.no_grad():
        m.lin.weight.fill_(1.0)
        m.lin.bias.zero_()
        with nan_hunter.watch(m, level="modules") as w:
            m(torch.full((1, 4), 2.0).half())
    f = w.report().first_nonfinite
    assert f.module == "lin" and f.call_index == 1


def test_inplace_ops_seen_before_and_after():
    class Inplace(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(x * 1.0)

    m = Inplace()
    with nan_hunter.watch(m, level="modules") as w:
        m(torch.tensor([-1.0, 2.0]))
    rows = w.stats()
    act = next(c for c in w.calls if c.module == "act")
    assert rows[act.inputs[0][1]].absmax == 1.0 or rows[act.inputs[0][1]].absmax == 2.0
    assert rows[act.outputs[0][1]].absmax == 2.0


@pytest.mark.parametrize("level", ["blocks", "modules", "ops"])
def test_inference_mode_and_empty_tensors(level):
    class WithEmpty(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            empty = x[:, :0] * 2.0  # an empty intermediate, as real models make
            return self.lin(x), empty

    m = WithEmpty().eval()
    with torch.inference_mode(), nan_hunter.watch(m, level=level) as w:
        out, _ = m(torch.randn(2, 4))
        m(torch.randn(2, 4))
    assert torch.isfinite(out).all()
    assert w.report().first_nonfinite is None


def test_weights_corrupted_between_forwards_of_one_watch():
    """One watch around several steps: a weight that goes NaN in place between forwards (what a
    bad optimizer step does) is blamed as weights in the first forward that used it. Forward 1's
    inputs are not retained (retain=1), so this is the capture's own answer, not a re-run's."""
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(4, 8)
    with torch.no_grad(), nan_hunter.watch(model, level="modules", retain=1) as w:
        model(x)
        model.layers[1][0].weight[2, 3] = float("nan")
        model(x)
        model(x)
    r = w.report()
    assert r.failed_inputs == [1, 2]
    f = r.first_nonfinite
    assert (f.input_index, f.module, f.role, f.tensor) == (1, "layers.1.0", "weights", "weight")


def test_no_rerun_after_weights_changed_in_place():
    """report() re-runs a failing forward only with the weights that forward used: after an
    in-place change (an optimizer step) it keeps the capture's answer and says why."""
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        model.layers[0][0].weight.fill_(1e38)  # layers.0.0 overflows fp32 -> inf
        with nan_hunter.watch(model, level="modules") as w:
            model(x)
        fresh = w.report().first_nonfinite
        w._report = None
        model.head.weight.mul_(1.0)  # same values, new version: weights "changed"
        stale = w.report()
    assert fresh.op is not None  # the re-run names the op
    assert stale.first_nonfinite.module == fresh.module and stale.first_nonfinite.op is None
    assert any("changed in place after forward 0" in n for n in stale.notes)
