"""``modes.protocol``: the harness's protocol (``Mode``), what a capture leaves (``Capture``), what a
mode's run leaves (``ModeRun``), and ``fill`` — the one way every mode's run becomes the report:
the ``run`` block, the module table, the inputs, near misses of a clean run or the located fault
through the assembler, the mode's own fields, the failed-inputs note."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
from stack6 import HOT, Stack  # noqa: E402

from nan_hunter.capture.listener import KeepSteps  # noqa: E402
from nan_hunter.capture.recorder import Recorder  # noqa: E402
from nan_hunter.config import default_config  # noqa: E402
from nan_hunter.dtypes import RunDtype  # noqa: E402
from nan_hunter.locate.judged_recording import Recording  # noqa: E402
from nan_hunter.model.prepare import Prepared  # noqa: E402
from nan_hunter.modes.base import ModeBase  # noqa: E402
from nan_hunter.modes.forward import ForwardMode  # noqa: E402
from nan_hunter.modes.harness import capture, locate_first, record  # noqa: E402
from nan_hunter.modes.protocol import Capture, Mode, ModeRun, fill  # noqa: E402
from nan_hunter.report import Report, RunInfo  # noqa: E402


def _prepared(model: nn.Module, values: list[float], dtype: str = "fp16") -> Prepared:
    run = RunDtype.of(dtype)
    batches = [{"x": torch.full((2, 8), v, dtype=run.torch_compute)} for v in values]
    return Prepared(
        None,
        model.to(run.torch_compute).eval(),
        None,
        "test",
        batches,
        [f"input {i}" for i in range(len(values))],
        run,
        torch.device("cpu"),
        default_config(),
    )


class Noting(ForwardMode):
    """A mode whose ``finish`` writes what it was given into the report."""

    name = "noting"

    def __init__(self) -> None:
        self.finished: list[tuple[dict[str, Any], Any]] = []

    def finish(self, p: Prepared, rep: Report, extra: dict[str, Any], located: Any) -> None:
        self.finished.append((extra, located))
        rep.notes.append(f"noting: {extra}")


def _row(module: str, absmax: float, index: int = 0, **kinds: int) -> dict[str, Any]:
    return {
        "module": module,
        "module_type": "Linear",
        "input_index": index,
        "absmax": absmax,
        "nan": kinds.get("nan", 0),
        "posinf": kinds.get("posinf", 0),
        "neginf": kinds.get("neginf", 0),
    }


# --- the dataclasses and the protocol -------------------------------------------------------------


def test_mode_run_defaults_are_empty_and_not_shared():
    a, b = ModeRun(None, [], []), ModeRun(2, [2], [_row("x", 1.0)])
    a.notes.append("n")
    a.extra["k"] = 1
    assert b.notes == [] and b.absorbed == [] and b.extra == {} and b.capture is None
    assert (b.first_input, b.failed) == (2, [2])


def test_capture_holds_what_one_group_left():
    m = nn.Linear(2, 2)
    keep = KeepSteps(m)
    rec = Recorder(m, level="modules", listener=keep)
    with rec, torch.no_grad():
        m(torch.ones(1, 2))
    cap = Capture([3], rec, keep, Recording.of(rec))
    assert cap.group == [3] and cap.recorder is rec and cap.keep is keep and cap.facts == {}
    assert cap.recording.failed == [] and cap.recording.finding is None


def test_the_modes_implement_every_member_of_the_protocol():
    members = {n for n in vars(Mode) if not n.startswith("_")} | set(Mode.__annotations__)
    assert {"name", "run_input", "rerun", "finish", "merge", "place", "grad", "retain"} <= members
    for mode in (ModeBase(), ForwardMode()):
        missing = [n for n in members if not hasattr(mode, n)]
        assert not missing, (type(mode).__name__, missing)


# --- fill -------------------------------------------------------------------------------------------


def test_fill_a_clean_run_gives_the_run_block_the_table_inputs_and_near_misses():
    p = _prepared(Stack(), [0.1, 0.2])
    table = [_row("layers.0", 60000.0), _row("layers.1", 1.0, index=1), _row("layers.2", 70000.0, posinf=1)]
    absorbed = [{"kind": "absorbed", "module": "layers.3", "op": "aten.mul.Tensor"}]
    run = ModeRun(None, [], table, notes=["a mask note"], absorbed=absorbed, extra={"facts": 1})
    rep = Report(notes=["a mask note"])
    mode = Noting()
    fill(p, mode, rep, run, None)
    assert isinstance(rep.run, RunInfo)
    assert (rep.run.dtype, rep.run.device, rep.run.n_inputs, rep.run.failed_inputs) == ("fp16", "cpu", 2, [])
    assert rep.run.inputs == ["input 0", "input 1"]
    assert rep.modules is table
    assert rep.inputs == [
        {"index": 0, "label": "input 0", "finite": True},
        {"index": 1, "label": "input 1", "finite": True},
    ]
    # near misses: layers.0 is past half of fp16's max; layers.2 is non-finite, not a near miss
    near = [n for n in rep.near_misses if n["kind"] == "near_overflow"]
    assert [n["module"] for n in near] == ["layers.0"] and near[0]["limit"] == 65504.0
    assert rep.near_misses[-1] is absorbed[0]
    assert rep.first_nonfinite is None and rep.diagnosis is None
    assert mode.finished == [({"facts": 1}, None)]
    assert rep.notes == ["a mask note", "noting: {'facts': 1}"]  # merged, not repeated; no failed note


def test_fill_notes_the_failed_inputs_of_a_data_set():
    p = _prepared(Stack(), [0.1, 0.2, 0.3])
    rep = Report()
    fill(p, ForwardMode(), rep, ModeRun(None, [0, 2], []), None)
    assert rep.notes == ["2 of 3 inputs produced non-finite values: #0 input 0, #2 input 2"]
    assert [r["finite"] for r in rep.inputs] == [False, True, False]
    single = _prepared(Stack(), [0.1])
    rep = Report()
    fill(single, ForwardMode(), rep, ModeRun(None, [0], []), None)
    assert rep.notes == []  # one input: nothing to add to the verdict


def test_fill_a_located_fault_goes_through_the_assembler():
    p = _prepared(Stack(), [0.1, 1.0])
    mode = Noting()
    run = record(p, mode, [0, 1])
    assert run.first_input == 1 and run.failed == [1] and run.capture is not None
    loc = locate_first(p, mode, run.capture)
    rep = Report()
    fill(p, mode, rep, run, loc)
    f = rep.first_nonfinite
    assert (f.module, f.role, f.input_index) == (f"layers.{HOT[0]}", "producer", 1)
    assert rep.diagnosis is not None and rep.diagnosis.cause == "overflow"
    assert rep.replay is not None and rep.replay["fp32"]["finite"] and not rep.replay["fp16"]["finite"]
    assert rep.near_misses == []  # a run with a fault lists none
    assert mode.finished == [({}, loc)]
    assert rep.run.failed_inputs == [1] and rep.notes[-1].startswith(
        "1 of 2 inputs produced non-finite values"
    )


def test_fill_without_replay_skips_the_replay_only():
    p = _prepared(Stack(), [1.0])
    run = record(p, ForwardMode(), [0])
    loc = locate_first(p, ForwardMode(), run.capture)
    rep = Report()
    fill(p, ForwardMode(), rep, run, loc, replay=False)
    assert rep.first_nonfinite.module == f"layers.{HOT[0]}" and rep.replay is None
    assert rep.diagnosis is not None


def test_a_capture_of_a_group_is_what_fill_reads():
    """``capture`` leaves a ``Capture`` whose recording, renumbered by the mode, is ``fill``'s table."""
    p = _prepared(Stack(), [0.1, 1.0])
    cap = capture(p, ForwardMode(), [1, 0])
    assert isinstance(cap, Capture) and cap.group == [1, 0] and cap.facts == {}
    table = ForwardMode().renumber(cap, cap.recording.table())
    rep = Report()
    fill(p, ForwardMode(), rep, ModeRun(None, ForwardMode().failed_of(p, cap), table), None)
    assert rep.run.failed_inputs == [1]
    assert {r["input_index"] for r in rep.modules} == {0, 1}
