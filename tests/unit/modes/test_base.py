"""``modes.base.ModeBase``: what a mode does unless it says otherwise — every input under one
capture, one root call each, steps mapped to data-set indices by order, re-run from what was kept."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from nan_hunter.config import default_config
from nan_hunter.dtypes import RunDtype
from nan_hunter.errors import BadInput
from nan_hunter.locate.rerun import KeptSteps
from nan_hunter.model.prepare import Prepared
from nan_hunter.modes.base import ModeBase
from nan_hunter.modes.harness import capture, locate_first


class Div(nn.Module):
    def forward(self, x):
        return x / x.sum()  # 0/0 for an all-zero input


class OneForward(ModeBase):
    name = "one-forward"

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        return [model(**kwargs)]


def _prepared(values: list[float]) -> Prepared:
    return Prepared(
        None,
        Div(),
        None,
        "test",
        [{"x": torch.full((2,), v)} for v in values],
        [f"input {i}" for i in range(len(values))],
        RunDtype.of("fp32"),
        torch.device("cpu"),
        default_config(),
    )


def test_defaults_map_steps_to_the_data_set_and_place_the_fault():
    p = _prepared([1.0, 0.0, 0.0, 1.0])
    mode = OneForward()
    assert mode.groups(p, [1, 2, 3]) == [[1, 2, 3]]
    cap = capture(p, mode, [1, 2, 3])
    assert mode.input_of(cap, 0) == 1 and mode.failed_of(p, cap) == [1, 2]
    assert {r["input_index"] for r in mode.renumber(cap, cap.recording.table())} == {1, 2, 3}
    assert isinstance(mode.rerun(p, cap), KeptSteps) and mode.facts(p, [cap], [1, 2]) == {}
    loc = locate_first(p, mode, cap)
    assert (loc.first.input_index, loc.first.step, loc.input_label) == (1, 0, "input 1")
    assert loc.first.op == "aten.div.Tensor" and loc.first.kind == "nan"


def test_a_model_error_is_bad_input_in_one_line():
    p = _prepared([1.0])
    p.batches[0] = {"y": torch.ones(2)}  # not an argument of forward()
    with pytest.raises(BadInput, match=r"the model raised TypeError in Div.forward\(\)"):
        capture(p, OneForward(), [0])


def test_inputs_run_without_grad_unless_the_mode_runs_with_grad():
    p = _prepared([1.0])

    class Grad(OneForward):
        grad = True

    for mode, want in ((OneForward(), False), (Grad(), True)):
        cap = capture(p, mode, [0])
        assert cap.keep.contexts[0].grad is want
        assert (cap.recorder.grads is not None) is want  # gradients captured only with grad
