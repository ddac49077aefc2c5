"""``scan --trace PATH``: the trace is written in the same pass as the capture, by a
``TraceRecorder`` observing each capture's recorder (``capture.listener.CallObserver``): it holds
what the model computed for each input as the mode ran it (a forward, a greedy decoding, a forward
and backward, a capsule's step), not what a report's re-runs did (the recorder is paused for them).

``--repeat N`` runs each input N-1 more times right after its captured run, from the same RNG
state, the capture paused (``Recorder.input_run``), and stores each entry's largest run-to-run
spread. ``--compile``: the trace records the compiled run that ``scan --compile`` makes anyway
(``modes.compiled``; a fresh compile state); the eager run is the other side of that comparison.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import BadInput
from ..options import TraceLevel, choice
from ..trace.env import inputs_hash
from ..trace.recorder import TraceRecorder

if TYPE_CHECKING:  # pragma: no cover
    from ..model.prepare import Prepared
    from .protocol import Mode

TRACE_LEVELS = tuple(m.value for m in TraceLevel)


@dataclass(frozen=True)
class TraceOptions:
    """``--trace PATH [--trace-level modules|ops] [--repeat N]`` (and the compile backend the run
    is traced under), validated at construction."""

    path: str
    level: str = "modules"
    repeat: int | None = None
    compile: str | None = None

    def __post_init__(self) -> None:
        if not self.path or "\0" in self.path:
            raise BadInput(f"--trace {self.path!r}: not a usable file name")
        object.__setattr__(
            self, "level", choice(TraceLevel, self.level, f"--trace-level {self.level!r}: use modules or ops")
        )
        if self.repeat is not None and (
            isinstance(self.repeat, bool) or not isinstance(self.repeat, int) or self.repeat < 2
        ):
            raise BadInput(f"--repeat {self.repeat!r}: give the number of runs per input, at least 2")
        if self.compile is not None and self.level == "ops":
            raise BadInput(
                "--trace-level ops with --compile: a dispatch mode makes torch.compile run the model "
                "eagerly, so an op-level trace would not record the compiled run; use --trace-level "
                "modules"
            )


def trace_for(p: Prepared, mode: Mode, opts: TraceOptions, command: list[str] | None = None) -> TraceRecorder:
    """The trace of a scan's pass over the inputs of ``p``: an observer of each capture's recorder
    (``modes.harness.run_mode``), or with ``--compile`` of the compiled run's
    (``modes.compiled.compare_compiled``); its file spans every group, closed by ``traced``."""
    inputs = [
        {"index": i, "label": p.labels[i], "hash": inputs_hash((), kw)} for i, kw in enumerate(p.batches)
    ]
    trace = TraceRecorder(
        None,
        opts.path,
        opts.level,
        opts.repeat,
        dtype=p.run.name,
        compile_backend=opts.compile,
        inputs=inputs,
        command=command,
        mode=mode.name,
    )
    trace.keep_open = True
    return trace


@contextlib.contextmanager
def traced(trace: TraceRecorder | None) -> Iterator[None]:
    """The pass that writes ``trace``: its file closed when the pass ends, removed when it fails
    (a run that fails leaves no file behind)."""
    if trace is None:
        yield
        return
    try:
        yield
    except BaseException:
        if trace.writer is not None:
            trace.writer.abandon()
        with contextlib.suppress(OSError):
            os.remove(trace.path)
        raise
    trace.close()


def trace_note(trace: TraceRecorder, opts: TraceOptions, n_inputs: int) -> str:
    """The report's note on a written trace."""
    n = trace.writer.entries if trace.writer else 0
    runs = opts.repeat or 1
    note = (
        f"trace written to {opts.path}: {n} {opts.level}-level entries of {n_inputs} input(s)"
        + (f", each run {runs} times (spread per entry)" if opts.repeat else "")
        + (f", the run compiled with backend {opts.compile}" if opts.compile else "")
    )
    if opts.compile and opts.level == "modules":
        note += " (calls inside the compiled region are not seen: the root's is)"
    if trace.repeat_mismatch:
        note += f"; {trace.repeat_mismatch} entr(ies) took another path on a re-run (spread null)"
    if trace.failures:
        note += f"; {len(trace.failures)} tensor(s) could not be read"
    return note
