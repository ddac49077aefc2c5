"""The producer rule as a pure function over a table of recorded calls (no model, no torch run).

Each case is a tiny call tree: (name, parent, input bad?, params bad?, output bad?) in pre-hook
order; completion order is innermost first."""

from __future__ import annotations

import pytest

from nan_hunter.capture.records import Call
from nan_hunter.locate.producer import failed_inputs, first_finding, mask_notes
from nan_hunter.stats import TensorStats

FINE = TensorStats(numel=4, absmax=1.0)
NAN = TensorStats(numel=4, nan=1, absmax=1.0)
POSINF = TensorStats(numel=4, posinf=1, absmax=1.0)
NEGINF = TensorStats(numel=4, neginf=2, absmax=1.0)


def table(spec: list[tuple[str, int | None, TensorStats, TensorStats | None, TensorStats]], step: int = 0):
    """Calls and rows from (module, parent index, input, params or None, output) in pre-hook order."""
    rows: list[TensorStats] = []
    calls: list[Call] = []

    def row(st: TensorStats) -> int:
        rows.append(st)
        return len(rows) - 1

    depth: dict[int, int] = {}
    for i, (name, parent, inp, par, out) in enumerate(spec):
        depth[i] = 0 if parent is None else depth[parent] + 1
        c = Call(i, name, name.split(".")[-1] or "Root", 0, depth[i], parent, step)
        c.inputs = [("args[0]", row(inp))]
        c.params = [("weight", row(par))] if par is not None else []
        c.outputs = [("out", row(out))]
        calls.append(c)
    # completion order: children finish before their parents (reverse depth, then pre order)
    for seq, c in enumerate(sorted(calls, key=lambda c: (-c.depth, c.start))):
        c.seq = seq
    return calls, rows


def test_producer_is_the_innermost_call_with_finite_inputs_and_bad_output():
    calls, rows = table([("", None, FINE, None, NAN), ("a", 0, FINE, FINE, FINE), ("b", 0, FINE, FINE, POSINF)])
    f = first_finding(calls, rows)
    assert (f.call.module, f.role, f.kind) == ("b", "producer", "posinf")


def test_bad_input_passes_blame_to_the_enclosing_call():
    # "b" gets an already-bad input from an op written in the root's own forward (a residual add)
    calls, rows = table([("", None, FINE, None, NAN), ("a", 0, FINE, FINE, FINE), ("b", 0, NAN, FINE, NAN)])
    f = first_finding(calls, rows)
    assert (f.call.module, f.role) == ("", "producer")


def test_bad_parameters_make_role_weights():
    calls, rows = table([("", None, FINE, None, NAN), ("a", 0, FINE, NAN, NAN)])
    f = first_finding(calls, rows)
    assert (f.call.module, f.role, f.tensor) == ("a", "weights", "weight")


def test_bad_data_names_the_first_module_that_received_it():
    calls, rows = table([("", None, NAN, None, NAN), ("a", 0, NAN, FINE, NAN)])
    f = first_finding(calls, rows)
    assert (f.call.module, f.role, f.kind) == ("a", "input", "nan")


def test_neginf_masks_absorbed_are_notes_not_faults():
    calls, rows = table([("", None, FINE, None, FINE), ("softmax", 0, NEGINF, None, FINE)])
    assert first_finding(calls, rows) is None
    assert failed_inputs(calls, rows) == []
    notes = mask_notes(calls, rows)
    assert len(notes) == 1 and "softmax" in notes[0] and "2 −inf" in notes[0]


@pytest.mark.parametrize("bad_step", [0, 1, 2])
def test_earliest_step_wins_and_failed_inputs_lists_each(bad_step):
    calls: list[Call] = []
    rows: list[TensorStats] = []
    for step in range(3):
        out = POSINF if step >= bad_step else FINE
        c, r = table([("", None, FINE, None, out), ("fc", 0, FINE, FINE, out)], step)
        for x in c:
            x.start += len(calls)
            x.parent = None if x.parent is None else x.parent + len(calls)
            x.seq += len(calls)
            x.inputs = [(lbl, i + len(rows)) for lbl, i in x.inputs]
            x.params = [(lbl, i + len(rows)) for lbl, i in x.params]
            x.outputs = [(lbl, i + len(rows)) for lbl, i in x.outputs]
        calls += c
        rows += r
    f = first_finding(calls, rows)
    assert (f.call.module, f.call.input_index) == ("fc", bad_step)
    assert failed_inputs(calls, rows) == list(range(bad_step, 3))
