"""What capture records: one ``Call`` per module call, pointing at stats rows in the sink.

Rows are indices into ``StatsSink.rows()``. A call belongs to a phase and a step (the root-call
index: one input of the data set, one training step or one decode step); locate searches calls
by step, then phase (``PHASES`` order), then completion order.

The phases record the same shape, read the same way (``inputs`` in, ``outputs`` out):
- ``"forward"``: a module call; inputs are its arguments, outputs its results, params its own
  parameters and buffers.
- ``"backward"``: the backward of one forward call (same ``start``, module, parent); inputs are
  the gradients that reached its outputs, outputs the gradients it produced w.r.t. its inputs
  and its parameters, ``order`` the backward event number of each output (autograd runs in
  reverse, so completion is ordered by event, not by ``seq`` of the forward).
- ``"optimizer"``: one parameter in one ``optimizer.step()``; inputs are the parameter and its
  gradient before the step, outputs the parameter after it, ``param`` its dotted name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Refs = list[tuple[str, int]]  # (label, row index) per measured tensor
PHASES = ("forward", "backward", "optimizer")  # the order of phases within one step


@dataclass(slots=True)  # one per module call: no per-instance __dict__
class Call:
    """One module call: where it sits, and the stats rows of what went in and came out."""

    start: int  # pre-hook order
    module: str
    module_type: str
    call_index: int  # how many times this module was called before, in this forward
    depth: int
    parent: int | None  # start index of the enclosing call
    input_index: int  # the step: root calls seen before this one (one input of the data set)
    inputs: Refs = field(default_factory=list)
    outputs: Refs = field(default_factory=list)
    params: Refs = field(default_factory=list)  # own parameters/buffers as seen by this call
    seq: int = -1  # post-hook order (innermost first); backward: first event; optimizer: param_groups order
    phase: str = "forward"
    order: list[int] = field(default_factory=list)  # backward: event number of each output
    param: str | None = None  # optimizer: the parameter's dotted name
