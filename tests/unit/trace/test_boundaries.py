"""trace/boundaries.py: a compiled run's module boundaries — every module call of an eager run with
a copy of its inputs (completion order), and each module compiled alone on them (backend
``eager`` here: dynamo's capture without a code generator, quick on the CPU; the inductor case
is tests/integration/test_trace_diff.py's eager-against-compiled diff)."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.trace.boundaries import compiled_alone, eager_calls


class AddOne(nn.Module):
    def forward(self, x):
        x.add_(1.0)  # in place: the copy taken before the call keeps the input as given
        return x


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), AddOne()), nn.Linear(4, 2))


def test_eager_calls_in_completion_order_with_copied_inputs():
    m = _model()
    x = torch.randn(3, 4)
    calls = eager_calls(m, (x,), {})
    assert [(c.name, c.call_index) for c in calls] == [("0", 0), ("1.0", 0), ("1.1", 0), ("1", 0), ("2", 0)]
    relu_out = torch.relu(m[0](x))
    assert torch.equal(calls[2].args[0], relu_out)  # AddOne's input before its in-place add


def test_each_module_compiled_alone_matches_eager_on_its_inputs():
    m = _model()
    calls = eager_calls(m, (torch.randn(3, 4),), {})
    got = list(compiled_alone(calls, "eager"))
    assert [why for _, _, why in got] == [None] * len(calls)
    lin = got[0]
    assert torch.equal(lin[1], lin[0].module(*lin[0].args))


def test_a_module_that_cannot_run_alone_is_left_out_with_why():
    class Bad(nn.Module):
        def forward(self, x):
            raise RuntimeError("needs its parent")

    calls = eager_calls(nn.Sequential(nn.Identity()), (torch.ones(2),), {})
    calls[0].module = Bad()
    ((_, out, why),) = compiled_alone(calls, "eager")
    assert out is None and why.startswith("0: ") and "needs its parent" in why
