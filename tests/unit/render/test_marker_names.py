"""Row markers survive shortening: capsule/optimizer rows keep ``step``, backward rows ``∇``."""

from __future__ import annotations

from rich.cells import cell_len

from nan_hunter.render.terminal.layout import shorten_middle


def test_step_prefix_is_kept():
    s = shorten_middle("step model.layers.17.mlp.down_proj.weight", 24)
    assert s.startswith("step ") and s.endswith("down_proj.weight") and cell_len(s) <= 24


def test_backward_and_input_markers_are_kept():
    assert shorten_middle("∇ encoder.layer.11.attention.output.dense", 20).startswith("∇ ")
    assert shorten_middle("#3 encoder.layer.11.attention.output.dense", 20).startswith("#3 ")


def test_plain_names_keep_their_layer_index():
    assert shorten_middle("encoder.layer.11.attention.output.dense", 26) == "encoder.layer.11.…dense"
