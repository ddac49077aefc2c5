"""nan_hunter/modes/watched.py ``located_from_watch``: a real watch's report of a forward fault
(tests/models/stack6.py in fp16) as the harness's ``Located``, renumbered to the scan's step
and input, with the replay of the failing region."""

from __future__ import annotations

import torch
from models.stack6 import HOT, Stack

from nan_hunter.dtypes import RunDtype
from nan_hunter.modes.watched import located_from_watch
from nan_hunter.session.watcher import Watch

RUN = RunDtype.of("fp16")


def watched():
    torch.manual_seed(0)
    m = Stack().half().eval()
    x = torch.ones(2, 8, dtype=torch.float16)
    w = Watch(m, level="modules", dtype=RUN)
    with w, torch.no_grad():
        m(x)

    def forward():
        with torch.no_grad():
            return m(x)

    return m, w.report(), forward


def test_the_watch_report_becomes_located_with_the_scans_numbering():
    m, wrep, forward = watched()
    assert wrep.first_nonfinite.module == f"layers.{HOT[0]}"
    loc = located_from_watch(wrep, m, RUN, "prompt 3", step=5, input_index=3, forward=forward, train=None)
    f = loc.first
    assert (f.module, f.role, f.phase, f.step, f.input_index) == (f"layers.{HOT[0]}", "producer", "forward", 5, 3)
    assert wrep.first_nonfinite.step == 0 and wrep.first_nonfinite.input_index == 0  # the report itself unchanged
    assert loc.run is RUN and loc.input_label == "prompt 3"
    assert loc.is_block  # stack6's layers are its repeated blocks
    assert loc.event is wrep.op_event and loc.event is not None and loc.event.op.startswith("aten.")
    assert loc.replay is not None and loc.replay["fp32"]["finite"] and not loc.replay["fp16"]["finite"]
    assert loc.table and all(row["input_index"] == 3 for row in loc.table)
    assert loc.verify_fix is not None  # a forward producer: its fix can be checked


def test_indices_renumber_the_module_rows():
    m, wrep, forward = watched()
    loc = located_from_watch(wrep, m, RUN, "x", step=0, input_index=7, forward=forward, train=None, indices=[7])
    assert {row["input_index"] for row in loc.table} == {7}


def test_without_replay_or_with_a_failing_replay_the_location_stands():
    m, wrep, forward = watched()
    loc = located_from_watch(wrep, m, RUN, "x", step=0, input_index=0, forward=forward, train=None, replay=False)
    assert loc.replay is None and loc.first.module == f"layers.{HOT[0]}"

    def broken():
        raise ValueError("cannot re-run\nsecond line")

    loc = located_from_watch(wrep, m, RUN, "x", step=0, input_index=0, forward=broken, train=None)
    assert loc.replay is None
    assert loc.notes[-1] == f"the replay of layers.{HOT[0]} (forward) could not be run: ValueError: cannot re-run"
