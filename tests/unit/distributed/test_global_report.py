"""nan_hunter/distributed/global_report.py, the pure helpers of ``combine``: the global order of
first faults, flat-index unravelling, the parameter a weights fault is in; and ``combine`` and
``local_reruns`` outside a process group."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.distributed.global_report import (
    _module_order,
    _order_key,
    _param_of,
    _unravel,
    collective,
    combine,
    local_reruns,
)
from nan_hunter.report import FirstNonfinite
from nan_hunter.session.watcher import Watch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(2, 2)
        self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
        self.head = nn.Linear(2, 1)

    def forward(self, x):
        x = self.embed(x)
        for b in self.layers:
            x = b(x)
        return self.head(x)


NET = Net()
MODULES = _module_order(NET)
PARAMS = {n: i for i, (n, _) in enumerate(NET.named_parameters())}


def summary(
    rank: int,
    step: int = 0,
    phase: str = "forward",
    module: str = "embed",
    role: str = "producer",
    param: str | None = None,
) -> dict:
    return {
        "rank": rank,
        "first_nonfinite": {"step": step, "phase": phase, "module": module, "role": role, "param": param},
    }


def order(*summaries: dict) -> list[int]:
    return [s["rank"] for s in sorted(summaries, key=lambda s: _order_key(s, MODULES, PARAMS))]


def test_module_order_is_named_modules_order():
    assert MODULES == {"": 0, "embed": 1, "layers": 2, "layers.0": 3, "layers.1": 4, "head": 5}


def test_earlier_step_wins_over_phase_module_and_rank():
    assert order(summary(0, step=2), summary(1, step=1, phase="optimizer", module="head")) == [1, 0]


def test_within_a_step_forward_then_backward_then_optimizer_then_unknown():
    ss = [
        summary(0, phase="optimizer", param="embed.weight"),
        summary(1, phase="backward", module="head"),
        summary(2, phase="forward", module="head"),
        summary(3, phase="other"),
    ]
    assert order(*ss) == [2, 1, 0, 3]


def test_forward_faults_follow_module_order_and_ties_go_to_the_lowest_rank():
    assert order(summary(2, module="head"), summary(1, module="layers.1"), summary(0, module="layers.1")) == [
        0,
        1,
        2,
    ]


def test_backward_runs_modules_in_reverse():
    assert order(
        summary(0, phase="backward", module="embed"),
        summary(1, phase="backward", module="layers.0"),
        summary(2, phase="backward", module="head"),
    ) == [2, 1, 0]


def test_the_roots_own_ops_come_after_its_children_but_its_inputs_first():
    assert _order_key(summary(0, module=""), MODULES, PARAMS)[2] == len(MODULES)
    assert _order_key(summary(0, module="", role="input"), MODULES, PARAMS)[2] == 0
    assert order(summary(0, module=""), summary(1, module="head"), summary(2, module="", role="input")) == [
        2,
        1,
        0,
    ]
    assert _order_key(summary(0, module="not.a.module"), MODULES, PARAMS)[2] == len(MODULES)


def test_optimizer_faults_follow_parameter_order():
    assert order(
        summary(0, phase="optimizer", module="", param="head.bias"),
        summary(1, phase="optimizer", module="", param="layers.0.weight"),
    ) == [1, 0]
    # a parameter this model does not have: placed by its module
    assert _order_key(summary(0, phase="optimizer", module="head", param="gone"), MODULES, PARAMS)[2] == 5


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 5), (1, 1, 4)])
def test_unravel_is_row_major_like_torch(shape):
    t = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    for i in range(t.numel()):
        idx = _unravel(i, shape)
        assert len(idx) == len(shape) and int(t[tuple(idx)]) == i


def test_unravel_of_a_zero_sized_dimension_does_not_divide_by_zero():
    assert _unravel(0, (0, 3)) == [0, 0]


def fnf(module: str, role: str, tensor: str | None = None, param: str | None = None) -> FirstNonfinite:
    return FirstNonfinite(
        input_index=0,
        module=module,
        module_type="Linear",
        op=None,
        kind="nan",
        role=role,
        tensor=tensor,
        param=param,
    )


def test_param_of_a_weights_fault():
    assert _param_of(fnf("layers.1", "weights", tensor="weight"), NET) == "layers.1.weight"
    assert _param_of(fnf("", "weights", tensor="head.bias"), NET) == "head.bias"
    assert _param_of(fnf("layers.1", "weights", tensor="scale"), NET) is None  # not a parameter
    assert _param_of(fnf("layers.1", "producer", tensor="out"), NET) is None
    assert _param_of(fnf("layers.1", "weights"), NET) is None
    assert (
        _param_of(fnf("x", "producer", param="given.name"), NET) == "given.name"
    )  # an optimizer fault's own


def test_without_a_process_group_combine_is_the_identity_and_local_reruns_does_nothing():
    w = Watch(Net())
    w.collective = True  # as nan_hunter.watch() marks its watches
    assert not collective(w)
    local = object()
    assert combine(local, w) is local
    hooks = dict(w.model._forward_pre_hooks)
    with local_reruns(w):
        pass
    assert dict(w.model._forward_pre_hooks) == hooks
