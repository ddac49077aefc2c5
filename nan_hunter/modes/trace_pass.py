"""``scan --trace PATH``: every input of the data set run once more under a ``TraceRecorder``,
through the mode's own ``run_input`` (a forward, a greedy decoding, a forward and backward, a
capsule's step), before the capture: the trace holds what the model computed, not what a
report's re-runs did.

``--repeat N`` runs each input N times in a row from the same RNG state and stores each entry's
largest run-to-run spread. ``--compile``: the trace records the compiled run (``torch.compile``
of the model, fresh compile state); the eager run is the other side of scan's own comparison.
"""

from __future__ import annotations

import contextlib
import os
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BadInput
from ..model.execute import run_context
from ..options import TraceLevel, choice
from ..trace.env import inputs_hash
from ..trace.recorder import TraceRecorder
from .compiled import fresh_compiles

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
        object.__setattr__(self, "level", choice(TraceLevel, self.level,
                                                 f"--trace-level {self.level!r}: use modules or ops"))
        if self.repeat is not None and (isinstance(self.repeat, bool) or not isinstance(self.repeat, int)
                                        or self.repeat < 2):
            raise BadInput(f"--repeat {self.repeat!r}: give the number of runs per input, at least 2")
        if self.compile is not None and self.level == "ops":
            raise BadInput("--trace-level ops with --compile: a dispatch mode makes torch.compile run the model "
                           "eagerly, so an op-level trace would not record the compiled run; use --trace-level "
                           "modules")


class _StopView:
    """What ``GenerateMode.run_input`` asks of a recorder: whether a step went non-finite."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.sink = types.SimpleNamespace(_device_rows=False)

    @property
    def first_failed(self) -> int | None:
        return self.rec.first_failed


def _run_one(mode: Mode, runner: Any, kwargs: dict[str, Any], p: Prepared, stop: _StopView) -> None:
    """One input through the mode, at the run's precision; a failure is bad input (as in capture)."""
    import torch


    grad = torch.set_grad_enabled(mode.grad)
    try:
        with grad, run_context(p.run):
            mode.run_input(runner, kwargs, stop)
    except BadInput:
        raise
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        raise BadInput(f"the traced run raised {type(e).__name__}: {msg[:300]}") from None


def write_trace(p: Prepared, mode: Mode, opts: TraceOptions, command: list[str] | None = None) -> str:
    """Run every input of ``p`` under a trace written to ``opts.path``; returns a note for the report.
    A run that fails leaves no file behind."""
    import torch


    inputs = [{"index": i, "label": p.labels[i], "hash": inputs_hash((), kw)} for i, kw in enumerate(p.batches)]
    runs = opts.repeat or 1
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    compiling = fresh_compiles() if opts.compile else contextlib.nullcontext()
    rec = None
    try:
        with compiling:
            runner = torch.compile(p.model, backend=opts.compile) if opts.compile else p.model
            rec = TraceRecorder(runner, opts.path, opts.level, opts.repeat, dtype=p.run.name,
                                compile_backend=opts.compile, inputs=inputs,
                                command=command, mode=mode.name)
            stop = _StopView(rec)
            with rec, torch.random.fork_rng(devices=devices):
                for i, kw in enumerate(p.batches):
                    state = torch.get_rng_state()
                    with rec.input(i):
                        for r in range(runs):
                            torch.set_rng_state(state)  # every re-run draws the same random numbers
                            rec.first_failed = None
                            with rec.run(r):
                                _run_one(mode, runner, kw, p, stop)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(opts.path)
        raise
    n = rec.writer.entries if rec.writer else 0
    note = (f"trace written to {opts.path}: {n} {opts.level}-level entries of {len(p.batches)} input(s)"
            + (f", each run {runs} times (spread per entry)" if opts.repeat else "")
            + (f", the run compiled with backend {opts.compile}" if opts.compile else ""))
    if opts.compile and opts.level == "modules":
        note += " (calls inside the compiled region are not seen: the root's is)"
    if rec.repeat_mismatch:
        note += f"; {rec.repeat_mismatch} entr(ies) took another path on a re-run (spread null)"
    if rec.failures:
        note += f"; {len(rec.failures)} tensor(s) could not be read"
    return note
