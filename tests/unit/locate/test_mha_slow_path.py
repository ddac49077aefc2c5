"""nan_hunter/locate/mha_slow_path.py: a NaN located in MultiheadAttention's fused fast path is
re-located through the slow path, on a real nn.MultiheadAttention with a fully masked row."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.capture.ops import OpEvent
from nan_hunter.capture.records import Call
from nan_hunter.locate.first_op import locate_op
from nan_hunter.locate.mha_slow_path import FUSED, fast_path_disabled, through_slow_path
from nan_hunter.locate.producer import Finding


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x, mask):
        return self.attn(x, x, x, key_padding_mask=mask, need_weights=False)[0]


def setup():
    torch.manual_seed(0)
    m = Attn().eval()
    x = torch.randn(2, 3, 4)
    mask = torch.tensor([[False, False, False], [True, True, True]])  # row 1 attends to nothing

    def rerun():
        with torch.no_grad():
            return m(x, mask)

    finding = Finding(Call(0, "attn", "MultiheadAttention", 0, 1, None, 0), "producer", "nan", "out")
    return m, rerun, finding


def test_the_fused_op_is_relocated_through_the_slow_path_and_the_flag_restored():
    m, rerun, finding = setup()
    fused = locate_op(m, rerun, finding)
    assert fused[0] is not None and FUSED in fused[0].op
    before = torch.backends.mha.get_fastpath_enabled()
    notes: list[str] = []
    ev, target, args, kwargs = through_slow_path(fused, lambda: locate_op(m, rerun, finding), notes)
    assert ev is not None and FUSED not in ev.op and ev.op.startswith("aten.")
    assert target is m.attn
    assert len(notes) == 1 and notes[0].startswith(
        "nn.MultiheadAttention ran its fused fast path (aten._native_multi_head_attention.default)"
    )
    assert notes[0].endswith(f"its slow path names the op: {ev.op}")
    assert torch.backends.mha.get_fastpath_enabled() == before


def test_another_op_or_no_event_is_kept_without_a_second_run():
    calls = []

    def locate():
        calls.append(1)
        return (None, None, (), {})

    notes: list[str] = []
    located = (
        OpEvent(op="aten.log.default", kind="nan", nan=1, posinf=0, neginf=0, source=None),
        None,
        (),
        {},
    )
    assert through_slow_path(located, locate, notes) is located
    none = (None, None, (), {})
    assert through_slow_path(none, locate, notes) is none
    assert calls == [] and notes == []


def test_a_slow_path_that_names_nothing_new_keeps_the_fused_answer():
    fused = (
        OpEvent(op=f"aten.{FUSED}.default", kind="nan", nan=1, posinf=0, neginf=0, source=None),
        None,
        (),
        {},
    )
    notes: list[str] = []
    assert through_slow_path(fused, lambda: (None, None, (), {}), notes) is fused
    assert through_slow_path(fused, lambda: fused, notes) is fused
    assert notes == []


def test_fast_path_disabled_restores_the_flag_even_on_error():
    before = torch.backends.mha.get_fastpath_enabled()
    try:
        with fast_path_disabled():
            assert torch.backends.mha.get_fastpath_enabled() is False
            raise KeyError("x")
    except KeyError:
        pass
    assert torch.backends.mha.get_fastpath_enabled() == before
