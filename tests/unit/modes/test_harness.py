"""The one harness (``modes.harness``): it owns the loop, the capture and the producer rule; every
mode fills the report the same way, and a new mode is a small class behind the protocol that says
only what differs — no copy of the forward path."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
from stack6 import HOT, Stack  # noqa: E402

from nan_hunter.config import default_config  # noqa: E402
from nan_hunter.dtypes import RunDtype  # noqa: E402
from nan_hunter.model.prepare import Prepared  # noqa: E402
from nan_hunter.modes.forward import ForwardMode  # noqa: E402
from nan_hunter.modes.harness import capture, locate_first, record, run_mode  # noqa: E402
from nan_hunter.report import Report, RunInfo  # noqa: E402


def prepared(model: nn.Module, batches: list[dict], dtype: str = "fp16") -> Prepared:
    run = RunDtype.of(dtype)
    model = model.to(run.torch_compute).eval()
    batches = [{k: v.to(run.torch_compute) for k, v in b.items()} for b in batches]
    return Prepared(
        None,
        model,
        None,
        "test",
        batches,
        [f"input {i}" for i in range(len(batches))],
        run,
        torch.device("cpu"),
        default_config(),
    )


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stack = Stack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stack(x)


def test_forward_mode_fills_the_report():
    p = prepared(Wrapped(), [{"x": torch.full((2, 8), 1.0)}, {"x": torch.full((2, 8), 2.0)}])
    rep = Report()
    run_mode(p, ForwardMode(), rep)
    assert isinstance(rep.run, RunInfo) and rep.run.n_inputs == 2 and rep.run["dtype"] == "fp16"
    assert rep.run.failed_inputs == [0, 1]
    f = rep.first_nonfinite
    assert (f.module, f.role, f.input_index) == (f"stack.layers.{HOT[0]}", "producer", 0)
    assert f.op is not None and f.op.startswith("aten.")
    assert rep.replay is not None and rep.replay["fp32"]["finite"] and not rep.replay["fp16"]["finite"]
    assert rep.diagnosis is not None and rep.diagnosis.cause == "overflow"
    assert [r["finite"] for r in rep.inputs] == [False, False]
    assert rep.to_dict()["run"]["failed_inputs"] == [0, 1]


def test_a_clean_run_gets_near_misses_and_no_finding():
    p = prepared(Wrapped(), [{"x": torch.full((2, 8), 0.1)}], dtype="fp32")
    rep = Report()
    run_mode(p, ForwardMode(), rep)
    assert rep.first_nonfinite is None and rep.diagnosis is None and rep.run.failed_inputs == []
    assert rep.modules and all(r["input_index"] == 0 for r in rep.modules)


class DoubledMode(ForwardMode):
    """A new mode in a few lines: each input runs on doubled data (a gain sweep, say)."""

    name = "doubled"

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        return super().run_input(model, {k: v * 2 for k, v in kwargs.items()}, recorder)

    def facts(self, p: Prepared, caps: list[Any], failed: list[int]) -> dict[str, Any]:
        return {"runs": sum(len(c.group) for c in caps)}

    def finish(self, p: Prepared, rep: Report, extra: dict[str, Any], located: Any) -> None:
        rep.notes.append(f"doubled: {extra['runs']} runs")


def test_a_new_mode_is_a_small_class():
    p = prepared(Wrapped(), [{"x": torch.full((2, 8), 0.4)}])  # finite once, overflows doubled
    rep = Report()
    run_mode(p, DoubledMode(), rep)
    assert rep.first_nonfinite is not None and rep.diagnosis.cause == "overflow"
    assert "doubled: 1 runs" in rep.notes
    assert record(p, ForwardMode(), [0]).capture is None  # the same input, not doubled, stays finite


def test_steps_are_data_set_indices_when_a_mode_records_a_share():
    """What a rank of a split run does: record inputs [1, 2] of three; steps are data-set indices."""
    p = prepared(Wrapped(), [{"x": torch.full((2, 8), v)} for v in (0.1, 1.0, 2.0)])
    rec = record(p, ForwardMode(), [1, 2])
    assert rec.first_input == 1 and rec.failed == [1, 2]
    assert {r["input_index"] for r in rec.table} == {1, 2}
    loc = locate_first(p, ForwardMode(), rec.capture)
    assert (loc.first.input_index, loc.first.step, loc.input_label) == (
        1,
        0,
        "input 1",
    )  # placed in the data set
    assert loc.first.module == f"stack.layers.{HOT[0]}" and loc.region is not None and loc.replay is None


def test_capture_keeps_every_steps_inputs_and_context_and_judges_by_the_producer_rule():
    p = prepared(Wrapped(), [{"x": torch.full((2, 8), v)} for v in (0.1, 1.0)])
    cap = capture(p, ForwardMode(), [0, 1])
    assert cap.group == [0, 1] and cap.recording.failed == [1]
    assert cap.recording.finding.call.input_index == 1  # the recorder's step (the second root call)
    assert (
        cap.recorder.inputs_of(1) is not None and cap.keep.contexts[1].grad is False
    )  # kept; run without grad
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in p.model.modules())  # detached afterwards
