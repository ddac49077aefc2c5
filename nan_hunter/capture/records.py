"""What capture records: one ``Call`` per module call, pointing at stats rows in the sink.

Rows are indices into ``StatsSink.rows()``. A call belongs to a phase (``"forward"`` today;
backward, optimizer steps and decode steps are further phases) and a step (the root-call index:
one input of the data set, one training step or one decode step); locate searches calls by
(step, completion order) whatever their phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Refs = list[tuple[str, int]]  # (label, row index) per measured tensor


@dataclass
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
    seq: int = -1  # post-hook order (innermost first)
    phase: str = "forward"


