"""nan_hunter/locate/first_op.py: the producing module call re-run under the op-level mode."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.capture.records import Call
from nan_hunter.locate.first_op import locate_op
from nan_hunter.locate.producer import Finding


class LogNeg(nn.Module):
    def forward(self, x):
        return torch.log(x - 10.0)  # negative operand → NaN


def _model():
    return nn.Sequential(nn.Linear(2, 2), LogNeg(), nn.Linear(2, 1))


def _finding(module: str, role: str = "producer") -> Finding:
    return Finding(Call(0, module, "LogNeg", 0, 1, None, 0), role, "nan", "out")


def test_locate_op_names_the_aten_op_of_the_producing_module():
    m = _model()
    x = torch.ones(1, 2)
    ev, target, args, kwargs = locate_op(m, lambda: m(x), _finding("1"))
    assert target is m[1]
    assert ev is not None and ev.op == "aten.log.default" and ev.kind == "nan"
    assert len(args) == 1 and torch.equal(args[0], m[0](x))  # the inputs the module received


def test_bad_input_has_no_producing_op():
    m = _model()
    ev, target, args, kwargs = locate_op(m, lambda: m(torch.ones(1, 2)), _finding("1", role="input"))
    assert ev is None and target is m[1] and args == () and kwargs == {}


def test_the_call_index_picks_which_call_of_a_shared_module():
    shared = LogNeg()

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.f = shared

        def forward(self, x):
            return self.f(self.f(x + 20.0) + 30.0)  # call 0: log(x + 10) > 0; call 1 gets log(...) + 20

    m = Twice()
    x = torch.ones(1, 2)
    f = Finding(Call(0, "f", "LogNeg", 1, 1, None, 0), "producer", "nan", "out")
    ev, target, args, _ = locate_op(m, lambda: m(x), f)
    assert target is shared
    assert torch.allclose(args[0], torch.log(x + 10.0) + 30.0)  # the inputs of the second call
    assert ev is None  # log of a positive value: that call made nothing non-finite
