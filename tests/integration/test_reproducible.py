"""``first_nonfinite.reproducible`` and the ``not_reproducible`` cause: a one-time corruption (one
flipped exponent bit, injected by a forward hook that fires once, as a failing device would)
against a deterministic overflow (the control)."""

from __future__ import annotations

import json

import torch
from torch import nn

import nan_hunter
from nan_hunter.report import Report


class Exp(nn.Module):
    def forward(self, x):
        return torch.exp(x) * 0.01


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), Exp()) for _ in range(2)])
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x)


def _flip_once(module: nn.Module, at_call: int) -> None:
    """On call ``at_call`` only, corrupt the bits of one output element into +inf (a finite value before)."""
    seen = {"n": 0}

    def hook(mod, args, out):
        seen["n"] += 1
        if seen["n"] == at_call + 1:
            out = out.clone()
            with torch.no_grad():
                out.view(torch.int32)[0, 0] = 0x7F800000  # sign 0, exponent all ones, mantissa 0: +inf
            return out
        return None

    module.register_forward_hook(hook)


def _train(model, bad_batch=None, level="blocks"):
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with nan_hunter.watch(model, level=level, backward=True, optimizer=opt) as w:
        for s in range(4):
            x = torch.randn(4, 8) if s != bad_batch else torch.full((4, 8), 400.0)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    return w.report()


def test_one_time_bit_flip_is_not_reproducible():
    torch.manual_seed(0)
    m = Net()
    _flip_once(m.layers[0], at_call=1)  # step 1's forward, once; the re-run is clean
    rep = _train(m)
    f = rep.first_nonfinite
    assert (f.step, f.phase, f.module, f.kind) == (1, "forward", "layers.0", "posinf")
    assert f.reproducible is False
    d = rep.diagnosis
    assert d.cause == "not_reproducible"
    assert "device cpu" in d.summary and "hardware" in d.summary and "rank" not in d.summary
    assert "another device" in d.fix and "ECC" in d.fix
    assert Report(first_nonfinite=f, diagnosis=d).exit_code() == 1  # a fault was observed
    assert json.loads(json.dumps(rep.to_dict()))["first_nonfinite"]["reproducible"] is False


def test_deterministic_overflow_is_reproducible():
    torch.manual_seed(0)
    rep = _train(Net(), bad_batch=1)
    f = rep.first_nonfinite
    assert (f.step, f.module, f.op, f.reproducible) == (1, "layers.0.1", "aten.exp.default", True)
    assert rep.diagnosis.cause == "overflow"


def test_no_fault_no_verdict():
    torch.manual_seed(0)
    assert _train(Net()).first_nonfinite is None
