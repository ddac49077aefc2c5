"""The producer rule as a pure function over a table of recorded calls (no model, no torch run).

Each case is a tiny call tree: (name, parent, input bad?, params bad?, output bad?) in pre-hook
order; completion order is innermost first."""

from __future__ import annotations

import pytest

from nan_hunter.capture.records import Call
from nan_hunter.kernels.stats import TensorStats
from nan_hunter.locate.producer import failed_inputs, first_finding, mask_notes

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
    calls, rows = table(
        [("", None, FINE, None, NAN), ("a", 0, FINE, FINE, FINE), ("b", 0, FINE, FINE, POSINF)]
    )
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


# -- training phases ---------------------------------------------------------------------------


def backward_table(spec, step: int = 0, rows: list | None = None):
    """Backward calls from (module, parent index, incoming grad, [(outgoing grad, event)...]) in
    forward pre-hook order (the same ``start`` numbering as the forward calls)."""
    rows = rows if rows is not None else []
    calls = []
    depth: dict[int, int] = {}

    def row(st: TensorStats) -> int:
        rows.append(st)
        return len(rows) - 1

    for i, (name, parent, incoming, outgoing) in enumerate(spec):
        depth[i] = 0 if parent is None else depth[parent] + 1
        c = Call(i, name, name.split(".")[-1] or "Root", 0, depth[i], parent, step, phase="backward")
        c.inputs = [("grad of out", row(incoming))]
        c.outputs = [(f"grad {j}", row(st)) for j, (st, _) in enumerate(outgoing)]
        c.order = [ev for _, ev in outgoing]
        c.seq = min(c.order) if c.order else -1
        calls.append(c)
    return calls, rows


def test_backward_first_bad_gradient_from_finite_incoming():
    # autograd runs the head first (event 0), then block b (events 1-2), then a (3-4), then the root input (5)
    calls, rows = backward_table(
        [
            ("", None, FINE, [(NAN, 5)]),
            ("a", 0, NAN, [(NAN, 3), (NAN, 4)]),
            ("b", 0, FINE, [(NAN, 2), (FINE, 1)]),
        ]
    )
    f = first_finding(calls, rows)
    assert (f.call.module, f.call.phase, f.role, f.kind, f.tensor) == (
        "b",
        "backward",
        "producer",
        "nan",
        "grad 0",
    )


def test_backward_bad_incoming_blames_the_enclosing_backward_code():
    # a gets a NaN gradient that no module produced: the op sits in the block's own forward (e.g. sqrt)
    calls, rows = backward_table(
        [("blk", None, FINE, [(NAN, 4)]), ("blk.lin", 0, NAN, [(NAN, 3)]), ("blk.out", 0, FINE, [(FINE, 1)])]
    )
    f = first_finding(calls, rows)
    assert (f.call.module, f.role) == ("blk", "producer")


def test_backward_bad_gradient_at_the_root_outputs_is_role_input():
    calls, rows = backward_table([("", None, POSINF, [(POSINF, 2)]), ("a", 0, POSINF, [(POSINF, 1)])])
    f = first_finding(calls, rows)
    assert (f.call.module, f.role, f.kind) == ("", "input", "posinf")


def test_backward_order_is_by_event_not_by_first_gradient():
    # the root's head gradient comes first and is finite; its embedding gradient goes bad last
    calls, rows = backward_table([("", None, FINE, [(FINE, 0), (NAN, 9)]), ("blk", 0, FINE, [(NAN, 4)])])
    f = first_finding(calls, rows)
    assert f.call.module == "blk"


def test_forward_fault_comes_before_the_same_steps_backward():
    fwd, rows = table([("", None, FINE, None, NAN), ("a", 0, FINE, FINE, NAN)])
    bwd, rows = backward_table([("", None, FINE, [(NAN, 0)])], rows=rows)
    f = first_finding(bwd + fwd, rows)
    assert (f.call.module, f.call.phase) == ("a", "forward")


def test_an_earlier_steps_backward_comes_before_a_later_forward():
    fwd, rows = table([("", None, FINE, None, NAN), ("a", 0, FINE, FINE, NAN)], step=1)
    bwd, rows = backward_table([("", None, FINE, [(NAN, 0)]), ("b", 0, FINE, [(NAN, 0)])], step=0, rows=rows)
    f = first_finding(fwd + bwd, rows)
    assert (f.call.input_index, f.call.phase, f.call.module) == (0, "backward", "b")
    assert failed_inputs(fwd + bwd, rows) == [0, 1]


def optimizer_calls(spec, step: int = 0):
    """Optimizer calls from (param, before, grad, after) in param_groups order."""
    rows: list[TensorStats] = []
    calls = []
    for i, (param, before, grad, after) in enumerate(spec):
        owner = param.rpartition(".")[0]
        c = Call(100 + i, owner, "Linear", 0, 0, None, step, phase="optimizer", param=param, seq=i)
        for label, st, refs in (
            (param, before, c.inputs),
            ("grad", grad, c.inputs),
            (param, after, c.outputs),
        ):
            rows.append(st)
            refs.append((label, len(rows) - 1))
        calls.append(c)
    return calls, rows


def test_optimizer_first_param_made_nonfinite_by_the_step():
    calls, rows = optimizer_calls(
        [
            ("a.weight", FINE, FINE, FINE),
            ("b.weight", FINE, NAN, NAN),
            ("c.weight", FINE, FINE, POSINF),
            ("d.weight", FINE, FINE, NAN),
        ]
    )
    f = first_finding(calls, rows)
    # b.weight had a NaN gradient (a backward fault, not the step's): c.weight is the first the step made
    assert (f.call.param, f.call.module, f.call.phase, f.kind, f.tensor) == (
        "c.weight",
        "c",
        "optimizer",
        "posinf",
        "c.weight",
    )
