"""``session.options.WatchOptions``: every watch option checked once, with the reason, before
anything is hooked; the watch reads the checked values."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import nan_hunter
from nan_hunter.dtypes import RunDtype
from nan_hunter.session.fault_policy import OnFault
from nan_hunter.session.options import WatchOptions


def test_checked_values_are_typed_and_frozen():
    o = WatchOptions(dtype="float16", on_fault="stop")
    assert o.run == RunDtype.of("fp16") and o.policy is OnFault.STOP and o.on_fault is OnFault.STOP
    assert WatchOptions().run is None and WatchOptions().policy is OnFault.RECORD
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.level = "ops"  # type: ignore[misc]


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"level": "layers"}, "level must be one of ('sentinel', 'blocks', 'modules', 'ops'), got 'layers'"),
        ({"retain": -1}, "retain must be a number of forwards"),
        ({"retain": 2.5}, "retain must be a number of forwards"),
        ({"retain": True}, "retain must be a number of forwards"),
        ({"dtype": "fp12"}, "unknown dtype 'fp12'"),
        ({"on_fault": "ignore"}, "on_fault must be one of"),
        ({"on_fault": "skip"}, "needs optimizer="),
        ({"capsule_dir": 3}, "capsule_dir must be a path"),
        ({"trace_level": "calls"}, "trace_level must be one of ('modules', 'ops'), got 'calls'"),
    ],
)
def test_a_bad_option_says_what_is_wrong(kw, says):
    with pytest.raises(ValueError) as e:
        WatchOptions(**kw)
    assert says in str(e.value)


def test_the_public_watch_checks_before_hooking_anything(tmp_path):
    m = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="trace_level"):
        nan_hunter.watch(m, trace=str(tmp_path / "t.jsonl"), trace_level="calls")
    assert not m._forward_hooks and not m._forward_pre_hooks and not (tmp_path / "t.jsonl").exists()


def test_skip_with_an_optimizer_and_a_trace_companion(tmp_path):
    m = nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with nan_hunter.watch(m, optimizer=opt, on_fault="skip", trace=str(tmp_path / "t.jsonl")) as w:
        m(torch.ones(1, 2))
    assert w.policy.kind is OnFault.SKIP and w.options.trace == str(tmp_path / "t.jsonl")
    assert (tmp_path / "t.jsonl").stat().st_size > 0  # the trace the options asked for was written
