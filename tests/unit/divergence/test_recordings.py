"""divergence/recordings.py: in-memory recordings as entries the one comparison takes — a
model's outputs per input (tensors kept), and a capture's finished forward calls with statistics
combined from their rows."""

from __future__ import annotations

import math

import pytest
import torch

from nan_hunter.capture.records import Call
from nan_hunter.divergence.recordings import Recorded, from_calls, from_outputs
from nan_hunter.trace.format import Stats


def test_from_outputs_one_entry_per_input_with_its_tensors():
    outs = [
        torch.tensor([1.0, -3.0]),
        {"logits": torch.tensor([float("inf"), 2.0]), "ids": torch.tensor([1, 2])},
    ]
    r0, r1 = from_outputs(outs, module="lm", module_type="Llama")
    assert (r0.index, r0.input_index, r0.module, r0.module_type, r0.dtype) == (0, 0, "lm", "Llama", "fp32")
    assert (r0.stats.absmax, r0.stats.kind) == (3.0, None) and torch.equal(r0.values[0], outs[0])
    assert (r1.stats.posinf, r1.stats.absmax, r1.stats.kind) == (1, 2.0, "posinf")
    assert len(r1.values) == 1  # the integer tensor is not a floating output
    assert r0.key == ("lm", 0, 0, 0, "forward")


def test_an_output_without_floating_tensors():
    (r,) = from_outputs([torch.tensor([1, 2])])
    assert r.stats == Stats(0, 0, 0, None, None, None, None, None) and r.dtype is None and r.values == ()


class Row:
    """A capture stats row (``kernels.stats.TensorStats``'s fields the recording reads)."""

    def __init__(self, numel, absmax, min_nonzero=None, nan=0, posinf=0, neginf=0, total=None, sumsq=None):
        self.numel, self.absmax, self.min_nonzero = numel, absmax, min_nonzero
        self.nan, self.posinf, self.neginf, self.sum, self.sumsq = nan, posinf, neginf, total, sumsq


def _call(start, module, seq, outputs, phase="forward"):
    return Call(start, module, "Linear", 0, 1, None, 0, outputs=outputs, seq=seq, phase=phase)


def test_from_calls_in_completion_order_finished_forward_calls_only():
    rows = [
        Row(4, 2.0, 0.5, total=4.0, sumsq=8.0),
        Row(2, 3.0, 1.0, posinf=1, total=3.0, sumsq=9.0),
        Row(4, 1.0),
    ]
    calls = [
        _call(0, "outer", 2, [("out", 0), ("out", 1)]),  # finishes last (post-hook order)
        _call(1, "inner", 1, [("out", 2)]),
        _call(2, "unfinished", -1, [("out", 2)]),
        _call(3, "grad", 0, [("out", 2)], phase="backward"),
        _call(4, "no outputs", 0, []),
    ]
    inner, outer = from_calls(calls, rows)
    assert [(r.index, r.module) for r in (inner, outer)] == [(0, "inner"), (1, "outer")]
    s = outer.stats
    assert (s.nan, s.posinf, s.absmax, s.absmin) == (0, 1, 3.0, 0.5)
    assert s.mean == pytest.approx(7.0 / 5) and s.l2 == pytest.approx(math.sqrt(17.0))  # 4 + 1 finite values
    assert inner.stats.mean is None and inner.stats.l2 is None  # a row without its sums


def test_recorded_is_what_compare_reads():
    r = Recorded(0, "m", "M", 0, 0, 0, Stats(0, 0, 0, 1.0, 1.0, 0.0, 1.0, None), "fp32")
    assert r.key == ("m", 0, 0, 0, "forward") and r.op is None and r.producers is None
