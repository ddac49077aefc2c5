"""Eager against ``torch.compile`` on the same prepared inputs (``scan --compile``).

Every input runs eager and compiled; the report's ``compile`` block says whether each is finite
and how far apart they are: ``max_rel_err`` = max |compiled − eager| / max |eager| over the
model's floating outputs (elements finite in both). When the two part (one finite and not the
other, or ``max_rel_err`` > ``rtol``), the module where they part is found top-down from the
root: the children of the current module are captured eager, each child is compiled alone and
fed the eager inputs of its call, in call order, and the search descends into the first child
whose compiled output parts from its eager one. A module none of whose children part alone is
the answer: its compiled graph fuses across them. With the inductor backend the whole model is
then compiled again with ``torch._inductor.config.emulate_precision_casts = True`` (restored
after) to tell whether rounding intermediates as eager does closes the gap.

Compiles are fresh (``torch._dynamo.reset()`` before each one and at the end), so nothing
leaks into later compiles of the process and no cache limit silently turns a compile into eager.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..capture.recorder import Recorder
from ..capture.run import forward
from ..capture.targeted import child_calls
from ..divergence.compare import compare_recordings
from ..divergence.recordings import from_outputs
from ..errors import BadInput
from ..explain.assemble import compile_verdict
from ..model import copy_run
from ..report import CompileResult
from .trace_pass import traced

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from ..model.prepare import Prepared
    from ..report import Report

DEFAULT_RTOL = 1e-2


# -- comparing outputs --------------------------------------------------------------------------


@dataclass
class Parting:
    """Eager against compiled outputs of one call (or of the whole model over every input)."""

    eager_finite: bool = True
    compiled_finite: bool = True
    rel_err: float | None = None  # over elements finite in both; None when there are none
    compiled_kind: str | None = None  # nan | posinf | neginf: what the compiled outputs hold
    eager_kind: str | None = None
    #: the one comparison's ``error``: inf where a non-finite class differs element by element (a NaN
    #: against an inf, or at other elements) or the structure differs, else ``rel_err``
    error: float = 0.0

    def parts(self, rtol: float) -> bool:
        return (
            self.eager_finite != self.compiled_finite
            or self.error > rtol
            or (self.rel_err is not None and self.rel_err > rtol)
        )

    def merge(self, other: Parting) -> Parting:
        errs = [e for e in (self.rel_err, other.rel_err) if e is not None]
        return Parting(
            self.eager_finite and other.eager_finite,
            self.compiled_finite and other.compiled_finite,
            max(errs) if errs else None,
            self.compiled_kind or other.compiled_kind,
            self.eager_kind or other.eager_kind,
            max(self.error, other.error),
        )


def compare(eager: Any, compiled: Any) -> Parting:
    """The compiled outputs against eager's: two one-entry recordings through the one comparison
    of recordings (``divergence.compare``), which judges entries that kept their tensors element
    by element (``kernels.compare``: float64, ``rel_err`` over the elements finite on both sides,
    inf for a different structure)."""
    return compare_runs([eager], [compiled])[0]


def compare_runs(eager: list[Any], compiled: list[Any]) -> list[Parting]:
    """Per input, the compiled run's outputs against eager's: the two runs as recordings (one
    entry per input, tensors kept) compared the way ``nanhunter diff`` compares two traces."""

    cmp = compare_recordings(from_outputs(compiled), from_outputs(eager))
    return [_parting(cmp.verdicts[i].comparison) for i in sorted(cmp.verdicts)]


def _parting(c: Any) -> Parting:
    return Parting(c.ref_finite, c.finite, c.rel_err, c.kind, c.ref_kind, c.error)


# -- compiling ----------------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_compiles(emulate_precision_casts: bool | None = None) -> Iterator[None]:
    """Compile state reset on entry and exit; ``emulate_precision_casts`` set inside (and the
    user's value restored after, whatever happens)."""
    import torch._dynamo
    import torch._inductor.config as inductor_config

    old = inductor_config.emulate_precision_casts
    torch._dynamo.reset()
    try:
        if emulate_precision_casts is not None:
            inductor_config.emulate_precision_casts = emulate_precision_casts
        yield
    finally:
        inductor_config.emulate_precision_casts = old
        torch._dynamo.reset()


def _call(fn: Callable[..., Any], args: tuple, kwargs: dict, run: Any, what: str) -> Any:
    """One no-grad call at the run's precision; a failure to compile or run is bad input."""

    try:
        return copy_run.call(fn, args, kwargs, run)
    except BadInput:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise BadInput(
            f"{what} failed: {type(e).__name__}: {msg[:300]}; try --compile-backend aot_eager or "
            "eager to narrow it down"
        ) from None


def compile_module(module: nn.Module, backend: str) -> Callable[..., Any]:
    """``torch.compile(module)``: a wrapper; ``module`` itself is left as it is."""
    import torch

    return torch.compile(module, backend=backend)


# -- locating -----------------------------------------------------------------------------------


@dataclass
class Divergence:
    """Where eager and compiled first part, and what the search saw on the way."""

    module: str
    module_type: str
    parting: Parting
    children_alike: list[str] = field(default_factory=list)  # children that match eager compiled alone
    skipped: list[str] = field(default_factory=list)  # children that could not be compiled alone


def first_divergent(
    model: nn.Module, kwargs: dict, whole: Parting, backend: str, rtol: float, run: Any
) -> Divergence:
    """Top-down search (module docstring) for one input whose whole-model runs part."""

    name, mod, args, kw, part = "", model, (), kwargs, whole
    while True:
        alike: list[str] = []
        skipped: list[str] = []
        hit = None

        def eager(m: Any = mod, a: tuple = args, k: dict = kw, n: str = name) -> Any:
            return _call(m, a, k, run, f"the eager forward of {n or '<root>'}")

        for call in child_calls(mod, name, eager):
            if call.name in skipped:
                continue
            with fresh_compiles():
                try:
                    fn = compile_module(call.module, backend)
                    out = _call(fn, call.args, call.kwargs, run, f"torch.compile of {call.name}")
                except (
                    BadInput
                ):  # a child dynamo cannot take alone (a cache object, ...): judged by its parent
                    skipped.append(call.name)
                    continue
            p = compare(call.output, out)
            if p.parts(rtol):
                hit = (call, p)
                break
            if call.name not in alike:
                alike.append(call.name)
        if hit is None:
            return Divergence(name, type(mod).__name__, part, alike, skipped)
        call, part = hit
        name, mod, args, kw = call.name, call.module, call.args, call.kwargs


# -- the stage ----------------------------------------------------------------------------------


def _whole(
    model: nn.Module, batches: list[dict], eager_outs: list[Any], backend: str, run: Any, trace: Any = None
) -> tuple[Parting, list[Parting], float]:
    """The compiled model on every input against eager's outputs: (over all, per input, seconds).
    ``trace`` (``scan --compile --trace``): written by observing this run (``modes.trace_pass``)."""
    t0 = time.perf_counter()
    fn = compile_module(model, backend)
    what = f"torch.compile (backend {backend})"
    if trace is None:
        outs = [_call(fn, (), kw, run, what) for kw in batches]
    else:
        wrapper: Any = fn  # torch.compile's OptimizedModule: a module the recorder unwraps
        with traced(trace), Recorder(wrapper, capture=False, observers=[trace]) as rec:
            outs = [
                rec.input_run(i, lambda kw=kw: _call(fn, (), kw, run, what)) for i, kw in enumerate(batches)
            ]
    per = compare_runs(eager_outs, outs)
    total = per[0]
    for p in per[1:]:
        total = total.merge(p)
    return total, per, time.perf_counter() - t0


def compare_compiled(
    p: Prepared, rep: Report, backend: str = "inductor", rtol: float = DEFAULT_RTOL, trace: Any = None
) -> None:
    """Fill ``rep.compile`` (and, when the compiled run parts from a healthy eager one, the
    ``compile_divergence`` diagnosis; when eager fails and compiled does not, a note). ``trace``:
    a ``TraceRecorder`` written from the compiled run (``scan --compile --trace``)."""

    eager_outs = [forward(p.model, kw, p.run) for kw in p.batches]
    with fresh_compiles():
        total, per, took = _whole(p.model, p.batches, eager_outs, backend, p.run, trace)
    block = CompileResult(backend, total.eager_finite, total.compiled_finite, max_rel_err=total.rel_err)
    rep.compile = block
    rep.notes.append(
        f"torch.compile (backend {backend}): {len(p.batches)} input(s) compiled and run in "
        f"{took:.1f} s; max_rel_err {_fmt(total.rel_err)} against eager (rtol {rtol:g})"
    )
    parted = [i for i, q in enumerate(per) if q.parts(rtol)]
    if not parted:
        return
    idx = parted[0]
    div = first_divergent(p.model, p.batches[idx], per[idx], backend, rtol, p.run)
    block.first_divergent_module = div.module
    emu = None
    if backend == "inductor":
        with fresh_compiles(emulate_precision_casts=True):
            emu, _, _ = _whole(p.model, p.batches, eager_outs, backend, p.run)
        block.emulate_precision_casts = {
            "compiled_finite": emu.compiled_finite,
            "max_rel_err": emu.rel_err if emu.rel_err is not None else math.inf,
        }
    if not per[idx].eager_finite:
        if per[idx].compiled_finite:
            rep.notes.append(
                f"torch.compile ({backend}) stays finite where eager does not: they first part at "
                f"{div.module or '<root>'} ({div.module_type}), input #{idx} — the compiled graph "
                "keeps an intermediate in higher precision; the eager fault is diagnosed as usual"
            )
        return
    if rep.first_nonfinite is not None or rep.diagnosis is not None:
        return  # eager already failed on another input: that is the diagnosis
    evidence = {
        **block.to_dict(),
        "rtol": rtol,
        "input_index": idx,
        "input_label": p.labels[idx],
        "compiled_kind": per[idx].compiled_kind,
        "children_alike": div.children_alike,
        "skipped": div.skipped,
        "module_rel_err": div.parting.rel_err,
        "module_compiled_finite": div.parting.compiled_finite,
    }
    compile_verdict(
        rep,
        p.run,
        p.cfg,
        per[idx].compiled_kind,
        div.module,
        div.module_type,
        evidence,
        block.emulate_precision_casts,
        rtol,
    )


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"
