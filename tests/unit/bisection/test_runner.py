"""nan_hunter/bisection/runner.py ``candidates_of``: what bisect may keep, in first-call order."""

from __future__ import annotations

import pytest
import torch
from models.training_nets import Net
from torch import nn

from nan_hunter.bisection.runner import candidates_of
from nan_hunter.errors import BadInput


class Reordered(Net):
    """The head's input goes through ``pre`` first, defined last but called before the blocks."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x):
        x = self.pre(x)
        return super().forward(x)


def run_of(m: nn.Module):
    x = torch.ones(2, 4)
    return lambda: m(x)


def test_leaf_candidates_are_every_called_leaf_in_call_order():
    m = Reordered()
    assert candidates_of(m, run_of(m), "leaf") == [
        "pre",
        "layers.0.lin",
        "layers.0.gate",
        "layers.0.out",
        "layers.1.lin",
        "layers.1.gate",
        "layers.1.out",
        "head",
    ]  # never called: "unused" is not a candidate; containers are not either


def test_block_candidates_are_the_blocks_and_the_leaves_outside_them():
    m = Reordered()
    assert candidates_of(m, run_of(m), "block") == ["pre", "layers.0", "layers.1", "head"]


def test_a_blamed_container_is_added_and_a_blamed_leaf_is_not_duplicated():
    m = Net()
    # leaf granularity: the block's own forward (x + out(...)) is fixed only by keeping the block
    assert candidates_of(m, run_of(m), "leaf", blamed="layers.1") == [
        "layers.0.lin",
        "layers.0.gate",
        "layers.0.out",
        "layers.1",
        "layers.1.lin",
        "layers.1.gate",
        "layers.1.out",
        "head",
    ]
    assert candidates_of(m, run_of(m), "leaf", blamed="head") == candidates_of(m, run_of(m), "leaf")
    # block granularity: a module inside a candidate block is covered by the block
    assert candidates_of(m, run_of(m), "block", blamed="layers.1.gate") == ["layers.0", "layers.1", "head"]
    # the root blamed (its own ops, empty name): nothing added (keeping the root would keep everything)
    assert candidates_of(m, run_of(m), "block", blamed="") == ["layers.0", "layers.1", "head"]


def test_block_granularity_needs_repeated_blocks():
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(BadInput, match="no repeated ModuleList of blocks; use leaf"):
        candidates_of(m, run_of(m), "block")


def test_candidates_leave_no_hooks_behind():
    m = Net()
    candidates_of(m, run_of(m), "leaf")
    assert all(not s._forward_pre_hooks for s in m.modules())
