"""nan_hunter/capture/blocks.py: the repeated blocks of a model (what level "blocks" watches)."""

from __future__ import annotations

from models.stack6 import Stack
from models.training_nets import Net
from torch import nn

from nan_hunter.capture.blocks import main_blocks


def test_the_layers_of_small_models():
    assert main_blocks(Stack()) == [f"layers.{i}" for i in range(6)]
    assert main_blocks(Net()) == ["layers.0", "layers.1"]


def test_the_largest_uniform_module_list_wins():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.small = nn.ModuleList([nn.Linear(2, 2) for _ in range(5)])  # 30 parameters
            self.big = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])  # 144 parameters
            self.mixed = nn.ModuleList([nn.Linear(32, 32), nn.ReLU()])  # larger, but not uniform
            self.empty = nn.ModuleList()

    assert main_blocks(Two()) == ["big.0", "big.1"]


def test_a_root_module_list_and_no_list_at_all():
    assert main_blocks(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])) == ["0", "1"]
    assert (
        main_blocks(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))) == []
    )  # Sequential is not a ModuleList
