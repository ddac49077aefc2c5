"""What backward and capsule steps share: a watch's report of a step, as a located fault.

Backward faults and capsule steps are recorded under a ``session.Watch`` (level "modules",
gradients and optimizer steps captured); its ``report()`` re-runs the failing step for the
module, the aten op and the autograd node. ``located_from_watch`` turns that report into the
harness's ``Located``: the step numbering of the scan, the replay of the failing region for its
phase (``replay.replay``, ``replay.backward_replay``, ``replay.optimizer_replay``) and, for a
capsule's optimizer fault, the op and the optimizer state named from the capsule's pre-step copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..dtypes import RunDtype
    from ..explain.assemble import Located
    from ..session.watch_report import WatchReport


def located_from_watch(wrep: WatchReport, model: Any, run: RunDtype, label: str, step: int, input_index: int,
                       forward: Callable[[], Any], train: Callable[[], None] | None,
                       optimizer: dict[str, Any] | None = None, replay: bool = True,
                       indices: list[int] | None = None) -> Located:
    """The watch's first fault as the harness's ``Located`` (scan numbering: ``step``, ``input_index``).
    ``forward``/``train``: re-run the failing step's forward / forward and backward (for the region
    the replay starts from); ``optimizer``: a capsule's optimizer pieces; ``indices``: the data-set
    index of each of the watch's steps (module rows are renumbered with it)."""
    from ..capture.blocks import main_blocks
    from ..explain.assemble import Located

    f = wrep.first_nonfinite
    assert f is not None
    f = dataclasses.replace(f, step=step, input_index=input_index)
    notes = list(wrep.notes)
    matrix = None
    if replay and f.role == "producer":
        try:
            matrix = _replay(f, model, run, forward, train, optimizer)
        except Exception as e:  # noqa: BLE001 - the report stands without its replay; it says why
            notes.append(f"the replay of {f.module or '<root>'} ({f.phase}) could not be run: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    facts, ev = wrep.optimizer_facts, wrep.op_event
    if f.phase == "optimizer" and optimizer is not None and f.param in optimizer["grads"]:
        facts = facts or _optimizer_facts(f.param, optimizer, model)
        if f.op is None:
            ev = _optimizer_event(f.param, optimizer, model)
            if ev is not None:  # named from the capsule's pre-step state after all
                f.op = ev.op
                notes = [n for n in notes if n != wrep.op_missing]
    table = [dict(row) for row in wrep.calls]
    for row in table:
        row["input_index"] = input_index if indices is None else indices[row["input_index"]]
    wr = wrep.run
    extra = {"optimizer_steps": wr.optimizer_steps, "scaler_skipped_steps": wr.scaler_skipped_steps} if wr else {}
    verify = None
    if f.phase == "forward" and f.role == "producer":
        from ..explain import fix_check

        def verify(d: Any) -> None:
            fix_check.check_call(d, model, f.module, f.call_index, forward, run)

    return Located(f, run, ev, matrix, is_block=f.module in set(main_blocks(model)), input_label=label,
                   optimizer_facts=facts, table=table, notes=notes, extra=extra, verify_fix=verify)


def _replay(f: Any, model: Any, run: RunDtype, forward: Callable[[], Any], train: Callable[[], None] | None,
            optimizer: dict[str, Any] | None) -> dict[str, dict] | None:
    from ..capture.targeted import backward_region, call_inputs
    from ..explain.replay import backward_replay, optimizer_replay, replay

    if f.phase == "forward":
        target = model.get_submodule(f.module) if f.module else model
        margs, mkw = call_inputs(model, forward, f.module, f.call_index)
        return replay(target, margs, mkw, run)
    if f.phase == "backward" and train is not None:
        target, margs, mkw, grads = backward_region(model, train, f.module, f.call_index)
        return backward_replay(target, margs, mkw, grads, run)
    if f.phase == "optimizer" and optimizer is not None and f.param in optimizer["grads"]:
        name = f.param
        return optimizer_replay(optimizer["class"], optimizer["hyper"][optimizer["groups"].get(name, 0)],
                                optimizer["weights"][name],
                                optimizer["grads"][name], optimizer["state"].get(name, {}), run)
    return None


def _fresh_optimizer(name: str, optimizer: dict[str, Any], model: Any) -> tuple[Any, Any]:
    """One parameter, as before the step, in a fresh optimizer of the recorded class,
    hyperparameters and state (the watched re-run has stepped the model's own parameters)."""
    from ..locate.training import fresh_optimizer

    return fresh_optimizer(optimizer["class"], optimizer["hyper"][optimizer["groups"].get(name, 0)],
                           optimizer["weights"][name], optimizer["grads"][name], optimizer["state"].get(name, {}))


def _optimizer_event(name: str, optimizer: dict[str, Any], model: Any) -> Any:
    """The aten op inside the parameter's step that first made it non-finite."""
    from ..locate.training import first_bad_step

    try:
        o, _ = _fresh_optimizer(name, optimizer, model)
    except Exception:  # noqa: BLE001 - an optimizer that cannot be rebuilt this way: no op named
        return None
    return first_bad_step(o)


def _optimizer_facts(name: str, optimizer: dict[str, Any], model: Any) -> dict[str, Any] | None:
    from ..locate.training import optimizer_facts

    try:
        o, p = _fresh_optimizer(name, optimizer, model)
        o.step()
    except Exception:  # noqa: BLE001
        return None
    return optimizer_facts(o, p, name)
