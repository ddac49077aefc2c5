"""The one locate: ``locate(recording, rerun) -> Located``, whoever recorded the run.

From the first fault the producer rule found in a recording (``locate.judged_recording``), the failing
step is run again (``locate.rerun``: from copies of its kept inputs, under the context it ran in,
with the weights it ran with) down to the module, the aten op and the region the replay and the
fix check re-run (``explain``, once). By phase:

- forward: the step's forward re-run under module-level capture (the recording may be coarser:
  ``watch(level="blocks")``); when the re-run does not fault again the same way the fault is not
  reproducible (``faulted_again``: the one comparison of two recordings). Then the failing module
  re-run alone under ``FirstBadOp`` for the op (an ``nn.MultiheadAttention`` fused fast path is
  re-run on its slow path to name the op), and the batch row and token position holding it.
- backward: the step's forward and backward re-run from the gradients kept at the model's outputs,
  first under module-level capture, then under the op-level mode for the op and autograd node;
  the failing module's inputs and output gradients are kept for the backward replay.
- optimizer: the parameter's step rebuilt from the state before it (a capsule's, or a watch's
  pre-step copy) for the op; the optimizer state that explains it, as read after the live step.

Nothing of the user's is written: weights are rebound for re-runs only, gradients are returned,
not accumulated, and the caller runs ``locate`` inside ``rerun.kept()``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any

from torch import nn

from ..capture.blocks import main_blocks
from ..capture.fresh_fill import fill_verdict
from ..capture.recorder import Recorder
from ..capture.snapshot import Snapshot
from ..capture.targeted import backward_region
from ..divergence.compare import compare_recordings
from ..divergence.recordings import from_calls
from ..model.copy_run import call
from ..model.execute import run_context, weights_as
from ..report import FirstNonfinite
from .backward_op import rerun_backward
from .first_op import locate_op
from .judged_recording import Recording
from .located import Located
from .mha_slow_path import FUSED, through_slow_path
from .position import token_position
from .producer import Finding, call_table, first_finding, mask_notes, to_first_nonfinite
from .region import BackwardRegion, OptimizerRegion, Region
from .rerun import Rerun
from .training_phases import locate_backward

#: why no op is named for an optimizer fault found without the state before the step
OPTIMIZER_OP_MISSING = (
    "the op inside optimizer.step() is not named: that needs the state before the step, "
    "kept only with watch(capsule_dir=...)"
)


def locate(recording: Recording, rerun: Rerun) -> Located:
    """The first fault of ``recording`` (it must have one), located by re-running its step."""
    finding = recording.finding
    assert finding is not None, "locate() needs a recording with a fault"
    phase = finding.call.phase
    if phase == "forward":
        loc = _forward(recording, rerun, finding)
    elif phase == "backward":
        loc = _backward(recording, rerun, finding)
    else:
        loc = _optimizer(recording, rerun, finding)
    loc.is_block = loc.first.module in set(main_blocks(rerun.model))
    if loc.input_label is None:
        loc.input_label = loc.first.tensor
    return loc


# -- forward ---------------------------------------------------------------------------------------


def faulted_again(
    original_calls: list[Any], original_rows: Any, rerun_calls: list[Any], rerun_rows: Any
) -> bool:
    """Whether the re-run's recording holds the failing forward's first non-finite value again: the
    one comparison of two recordings (``divergence.compare``, as ``nanhunter diff`` and ``scan
    --compile`` use it), paired by call; True when the failing forward's recording has no call to
    pair it with."""
    cmp = compare_recordings(from_calls(rerun_calls, rerun_rows), from_calls(original_calls, original_rows))
    again = cmp.same_first_fault
    return True if again is None else again


def _forward(rec: Recording, rerun: Rerun, finding: Finding) -> Located:
    recorder = rec.recorder
    idx = finding.call.input_index
    run = rerun.precision(idx, "forward")
    notes: list[str] = []
    snap = rerun.inputs(idx)
    state = rerun.weights(idx)
    opaque = idx in recorder.opaque_forwards
    missing = f"op-level location{' and module-level location' if recorder.level == 'blocks' else ''}"
    reproduced: bool | None = None  # first_nonfinite.reproducible: the re-run decides
    if snap is not None and recorder.weights_changed_since(idx) and state is None:
        notes.append(
            f"parameters changed in place after forward {idx} (an optimizer step?): it was not "
            f"re-run, since a re-run would use the new weights, so the {missing} is missing; "
            "call report() before the weights change to get them"
        )
    elif snap is not None:
        if snap.changed_since():
            notes.append(
                f"{snap.changed_since()} input tensor(s) of forward {idx} were changed in place "
                "after it started; the re-run uses them as they are now"
            )
        if opaque:
            notes.append(
                f"forward {idx} ran under torch.compile: capture cannot see inside a compiled "
                "region, so the module and op come from re-running that forward eagerly (the "
                "original module, not the compiled wrapper) from its captured inputs"
            )
        with weights_as(rerun.model, state):
            fine = _refine(rec, rerun, snap, idx, own_weights=state is not None)
        if fine is not None:
            fine.first.reproducible = True
            fine.notes = notes + [n for n in fine.notes if n not in notes]
            return fine
        reproduced = None if opaque or snap.changed_since() else False
        notes.append(
            f"re-running forward {idx} eagerly gave finite values: the non-finite value exists only "
            "in the compiled run (`nanhunter scan --compile` finds where compiled and eager part)"
            if opaque
            else f"re-running forward {idx} did not reproduce the non-finite value (a nondeterministic "
            "op, or inputs changed in place since?), so this location comes from the capture alone"
        )
    else:
        notes.append(f"inputs of forward {idx} were not kept, so the {missing} is missing")
    fnf = _owner_of_weights(rerun.model, finding, to_first_nonfinite(finding))
    fnf.reproducible = reproduced
    return Located(fnf, run, notes=notes)


def _refine(rec: Recording, rerun: Rerun, snap: Snapshot, idx: int, own_weights: bool) -> Located | None:
    """Module- then op-level location of one kept forward, on copies of its inputs, under the
    precision and context it ran in; None when the re-run did not fault again."""
    model = rerun.model
    fwd = rerun.forward(idx)
    assert fwd is not None
    fine = Recorder(model, level="modules", retain=1, device=rec.recorder.sink.device, first_step=idx)
    with fine:
        fwd()
    rows = fine.sink.rows()
    f = first_finding(fine.calls, rows)
    if f is None or not faulted_again(rec.recorder.calls_of(idx) or [], rec.rows, fine.calls, rows):
        return None
    notes: list[str] = []
    name = f.call.module
    row = None
    with rerun.around(name), contextlib.ExitStack() as stack:
        rerun.context(idx).enter(stack)

        def op_level() -> tuple[Any, nn.Module, tuple[Any, ...], dict[str, Any]]:
            return locate_op(model, fwd, f, rerun.run, grad=None)

        as_ran = op_level()
        ev, target, margs, mkw = through_slow_path(
            as_ran, op_level, notes
        )  # a fused MHA op: its slow path's op
        if f.role == "producer":
            ev = _read_of_fresh_memory(target, margs, mkw, ev, rerun.run, notes)
        fnf = to_first_nonfinite(f, ev)
        if f.role != "input":  # which token row holds it (a decode step: its position in the sequence)
            tp = token_position(call(target, margs, mkw, rerun.run), snap.kwargs)
            fnf.position, row = tp.position, tp.row
            if tp.note:
                notes.append(tp.note)
    if f.call.module_type == "MultiheadAttention" and as_ran[0] is not None and FUSED not in as_ran[0].op:
        notes.append(
            f"{name} (nn.MultiheadAttention) took its slow path on the re-run (in-projection, "
            f"scaled_dot_product_attention, out-projection as separate ops), as it does with grad on, in "
            f"train mode or when query, key and value differ: {ev.op} is an op of that path, not of "
            "the fused torch._native_multi_head_attention"
        )
    region = None
    if f.role == "producer":
        # with the weights of the failing step swapped in, the region keeps its own copy of them:
        # the replay and the fix check run after the swap is undone
        region = Region(
            name,
            copy.deepcopy(target) if own_weights else target,
            margs,
            mkw,
            whole=rerun.whole(idx),
            around=lambda: rerun.around(name),
        )
    return Located(
        fnf,
        rerun.precision(idx, "forward"),
        ev,
        region,
        table=call_table(fine.calls, rows),
        notes=mask_notes(fine.calls, rows) + notes,
        row=row,
    )


def _read_of_fresh_memory(
    target: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], ev: Any, run: Any, notes: list[str]
) -> Any:
    """The failing module re-run with fresh allocations NaN-filled, then zero-filled
    (``capture.fresh_fill``): when the fault follows the fill, the op that read the unwritten
    memory, with mechanism ``uninitialised_read``; else ``ev`` (arithmetic, as located)."""
    with run_context(run):
        verdict = fill_verdict(target, args, kwargs)
    if verdict is None or not verdict.uninitialised or verdict.op is None:
        return ev
    notes.append(
        f"the fault follows the fill of fresh allocations: {verdict.allocations} allocation(s) "
        "(torch.empty and the like) filled with NaN gave a non-finite result, filled with zeros a finite "
        f"one — {verdict.op.op} read memory that was never written"
    )
    return verdict.op


def _owner_of_weights(model: nn.Module, f: Finding, fnf: FirstNonfinite) -> FirstNonfinite:
    """At level "blocks" a call's parameters are its whole subtree's (``blocks.0.mlp.up.weight``
    for a block, ``head.weight`` for the root): name the module that owns the bad tensor."""
    if f.role != "weights" or not f.tensor or "." not in f.tensor:
        return fnf
    sub, _, leaf = f.tensor.rpartition(".")
    owner = f"{f.call.module}.{sub}" if f.call.module else sub
    try:
        mtype = type(model.get_submodule(owner)).__name__
    except AttributeError:
        return fnf
    return dataclasses.replace(fnf, module=owner, module_type=mtype, tensor=leaf, call_index=0)


# -- backward --------------------------------------------------------------------------------------


def _backward(rec: Recording, rerun: Rerun, finding: Finding) -> Located:
    recorder, model = rec.recorder, rerun.model
    f = finding.call.input_index
    grads = recorder.grads.root_grads.get(f) if recorder.grads is not None else None
    fwd = rerun.forward(f)
    changed = recorder.weights_changed_since(f)
    state = rerun.weights(f) if changed else None
    fnf = to_first_nonfinite(finding)
    table = rec.table()
    notes: list[str] = []
    ev = region = None
    if grads is None or fwd is None:
        notes.append(
            f"the inputs or output gradients of step {f} were not kept, so the backward was not re-run: "
            "module-level and op-level location are missing"
        )
    elif changed and state is None:
        notes.append(f"parameters changed after step {f} and were not kept, so its backward was not re-run")
    else:
        with weights_as(model, state):
            loc = locate_backward(model, fwd, grads, f, recorder.sink.device)
            if loc.finding is not None:
                ev = (
                    loc.event if loc.finding.role == "producer" else None
                )  # arrived non-finite: no op made it
                fnf = to_first_nonfinite(loc.finding, ev)
                fnf.reproducible = True
                table = loc.table
                if loc.finding.role == "producer":
                    region = _backward_region(rerun, loc.finding, fwd, grads, own_weights=state is not None)
            else:
                fnf.reproducible = False
                notes.append(
                    f"re-running the backward of step {f} gave finite gradients: the fault did not "
                    "reproduce (a nondeterministic kernel, or hardware), so this location comes from the "
                    "capture alone"
                )
    return Located(fnf, rerun.precision(f, "backward"), ev, region, table=table, notes=notes)


def _backward_region(
    rerun: Rerun, f: Finding, fwd: Any, grads: Any, own_weights: bool
) -> BackwardRegion | None:
    """The failing module's inputs and the gradients at its outputs, from one more re-run of the
    step's forward and backward."""
    model, name = rerun.model, f.call.module
    try:
        target, args, kwargs, gs = backward_region(
            model, lambda: rerun_backward(model, fwd, grads), name, f.call.call_index
        )
    except RuntimeError:  # the call did not happen on this re-run: no region to replay
        return None
    return BackwardRegion(
        name,
        copy.deepcopy(target) if own_weights else target,
        args,
        kwargs,
        gs,
        around=lambda: rerun.around(name),
    )


# -- optimizer -------------------------------------------------------------------------------------


def _optimizer(rec: Recording, rerun: Rerun, finding: Finding) -> Located:
    step = finding.call.input_index
    fnf = to_first_nonfinite(finding)
    facts = rerun.optimizer_facts(step, fnf.param)
    pieces = rerun.optimizer(step)
    notes: list[str] = []
    ev = region = missing = None
    if pieces is not None and pieces.has(fnf.param):
        assert fnf.param is not None
        ev = pieces.first_bad_op(fnf.param)
        if ev is not None:
            fnf.op, fnf.source = ev.op, None
            fnf.reproducible = True
        facts = facts or pieces.facts(fnf.param)
        region = OptimizerRegion(fnf.param, pieces)
    elif rec.recorder.optimizer is not None:
        missing = OPTIMIZER_OP_MISSING
        notes.append(missing)
    return Located(
        fnf,
        rerun.precision(step, "optimizer"),
        ev,
        region,
        optimizer_facts=facts,
        table=rec.table(),
        notes=notes,
        op_missing=missing,
    )
