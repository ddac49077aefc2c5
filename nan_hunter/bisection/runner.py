"""The torch side of bisect: runs the model with a keep set in high precision and feeds the pure
search (``search.py``) with pass/fail verdicts and the producer of each failing run."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..capture.blocks import main_blocks
from ..config import Config, as_config
from ..dtypes import RunDtype
from ..errors import BadInput
from ..execute import cast_batch, run_context
from ..load import open_checkpoint
from ..policy import install_hooks, set_precision
from ..prepare import parse_dtype, prepare, run_dtype
from ..replay import float_outputs, rel_err
from ..report import BisectResult, Report
from .search import minimal_keep_set, shortest_failing_prefix


def candidates_of(model: nn.Module, run: Callable[[], Any], granularity: str) -> list[str]:
    """Leaf modules (or blocks) in the order of their first call."""
    if granularity == "block":
        blocks = main_blocks(model)
        if not blocks:
            raise BadInput("--granularity block: this model has no repeated ModuleList of blocks; use leaf")
        return blocks
    order: list[str] = []
    seen: set[str] = set()
    handles = []
    for name, m in model.named_modules():
        if name and not any(True for _ in m.children()):
            def pre(mod, args, name=name):
                if name not in seen:
                    seen.add(name)
                    order.append(name)
            handles.append(m.register_forward_pre_hook(pre))
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return order


class MixedRunner:
    """Runs every input with a keep set in ``keep_dtype`` and the rest in ``dtype``."""

    def __init__(self, model: nn.Module, batches: list[dict], run: RunDtype, keep: RunDtype, rtol: float):
        self.model = model
        self.batches = batches
        self.run = run
        self.keep = keep
        self.dtype = run.name
        self.keep_dtype = keep.name
        self.rtol = rtol
        # full-precision master weights (as loaded), to restore kept modules without rounding
        self.master = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=False).items()
                       if v.is_floating_point()}
        self.ref: list[list[torch.Tensor]] = []
        self.runs = 0
        self.last_max_err = math.nan

    def _configure(self, keep: frozenset[str] | set[str]) -> list[Any]:
        pol = {m: self.keep_dtype for m in keep}
        set_precision(self.model, self.run, pol, self.master)
        return install_hooks(self.model, self.run, pol)

    def _inputs(self, kw: dict, run: RunDtype) -> dict:
        return cast_batch(kw, run, next(iter(self.master.values())).device if self.master else torch.device("cpu"))

    def outputs(self, keep: frozenset[str] | set[str], batches: list[dict] | None = None,
                all_high: bool = False) -> list[list[torch.Tensor]] | None:
        """Outputs per input, or None when the forward raised (a dtype mismatch counts as failing)."""
        if all_high:
            set_precision(self.model, self.keep, {}, self.master)
            handles: list[Any] = []
            run = self.keep
        else:
            handles = self._configure(keep)
            run = self.run
        res = []
        try:
            for kw in batches if batches is not None else self.batches:
                with torch.no_grad(), run_context(run):
                    res.append(float_outputs(self.model(**self._inputs(kw, run))))
        except RuntimeError:
            return None
        finally:
            for h in handles:
                h.remove()
        return res

    def reference(self) -> bool:
        out = self.outputs(frozenset(), all_high=True)
        self.runs += 1
        if out is None:
            return False
        self.ref = out
        return all(all(bool(torch.isfinite(t).all()) for t in o) for o in out)

    def passes(self, keep: frozenset[str]) -> tuple[bool, str | None]:
        self.runs += 1
        outs = self.outputs(keep)
        if outs is None:
            self.last_max_err = math.inf
            return False, None
        err = max((rel_err(o, r) for o, r in zip(outs, self.ref)), default=0.0)
        self.last_max_err = err
        if err <= self.rtol:
            return True, None
        return False, self.producer(keep)

    def producer(self, keep: frozenset[str]) -> str | None:
        """The first NaN/Inf producer of a failing run (a strong candidate for the search)."""
        from ..capture.recorder import Recorder
        from ..locate.producer import first_finding

        handles = self._configure(keep)
        w = Recorder(self.model, level="modules")
        try:
            with w, torch.no_grad(), run_context(self.run):
                for kw in self.batches:
                    self.model(**self._inputs(kw, self.run))
        except RuntimeError:
            return None
        finally:
            for h in handles:
                h.remove()
        f = first_finding(w.calls, w.sink.rows())
        return f.call.module if f is not None else None


def bisect(checkpoint: str, dtype: str = "fp16", keep_dtype: str = "fp32", arch: str | None = None,
           inputs: list[str] | None = None, prompts: list[str] | None = None, data: str | None = None,
           device: str = "auto", config: str | Config | None = None, attn: str | None = None,
           granularity: str | None = None, over: str = "modules", rtol: float | None = None,
           policy_out: str | None = None, progress: Callable[[int, str], None] | None = None) -> Report:
    cfg = as_config(config)
    dt = parse_dtype(dtype) or "fp16"
    keep = parse_dtype(keep_dtype) or "fp32"
    if keep not in ("fp32", "bf16"):
        raise BadInput(f"--keep-dtype {keep_dtype}: use fp32 or bf16")
    gran = granularity or cfg.bisect.granularity
    if gran not in ("leaf", "block"):
        raise BadInput(f"--granularity {gran}: use leaf or block")
    if over not in ("modules", "inputs"):
        raise BadInput(f"--over {over}: use modules or inputs")
    tol = float(rtol if rtol is not None else cfg.bisect.rtol)
    ck = open_checkpoint(checkpoint)
    # Prepare at the kept (high) precision; the runner casts per query from these master weights.
    p = prepare(ck, arch, inputs, prompts, data, keep, device, cfg, attn, need_model=True)
    if p is None or not p.batches:
        raise BadInput("bisect needs inputs: pass --inputs, --prompt or --data")
    runner = MixedRunner(p.model, p.batches, run_dtype(dt, cfg), run_dtype(keep, cfg), tol)
    rep = Report(checkpoint=ck.describe(), mode="bisect")
    rep.run = {"dtype": dt, "device": str(p.device), "n_inputs": len(p.batches), "failed_inputs": [],
               "inputs": p.labels}
    if not runner.reference():
        rep.bisect = BisectResult(dt, keep, [], runner.runs, False, None, gran)
        rep.notes.append(f"the run is non-finite even with everything in {keep}: no precision policy can fix it; "
                         f"run `nanhunter scan --dtype {keep}` to find the cause")
        return rep
    if over == "inputs":
        return _bisect_inputs(runner, p, rep, gran)
    cands = candidates_of(p.model, lambda: runner.outputs(frozenset()), gran)
    runner.runs += 1
    if progress is not None:
        progress(runner.runs, f"{len(cands)} candidate modules")

    def passes(k: frozenset[str]) -> tuple[bool, str | None]:
        ok, prod = runner.passes(k)
        if progress is not None:
            progress(runner.runs, f"kept {len(k)} → {'pass' if ok else 'fail'}")
        hint = None
        if prod is not None:
            hint = next((c for c in cands if prod == c or prod.startswith(c + ".")), None)
        return ok, hint

    res = minimal_keep_set(cands, passes)
    if not res.solvable or res.keep is None:
        rep.bisect = BisectResult(dt, keep, [], runner.runs, False, None, gran, res.bound, len(cands))
        rep.notes.append("keeping every candidate in high precision still fails the tolerance")
        return rep
    # Verification: the policy applied the public way, on a fresh copy of the model.
    finite_after, err = verify(p.model, runner, list(res.keep))
    runner.runs += 1
    failed = [i for i, o in enumerate(runner.outputs(frozenset()) or [])
              if not all(bool(torch.isfinite(t).all()) for t in o)]
    rep.run["failed_inputs"] = failed
    rep.bisect = BisectResult(dt, keep, list(res.keep), runner.runs, finite_after, err, gran, res.bound, len(cands))
    if policy_out:
        from ..policy import write_policy

        write_policy(policy_out, dt, keep, list(res.keep))
    return rep


def verify(model: nn.Module, runner: MixedRunner, keep: list[str]) -> tuple[bool, float]:
    from ..policy import apply_policy

    m = copy.deepcopy(model)
    m.load_state_dict({**m.state_dict(), **runner.master})
    set_precision(m, runner.keep, {}, runner.master)
    handle = apply_policy(m, {"dtype": runner.dtype, "keep_dtype": runner.keep_dtype,
                              "modules": {k: runner.keep_dtype for k in keep}})
    errs = []
    finite = True
    try:
        for kw, ref in zip(runner.batches, runner.ref):
            with torch.no_grad(), run_context(runner.run):
                outs = float_outputs(m(**runner._inputs(kw, runner.run)))
            finite &= all(bool(torch.isfinite(t).all()) for t in outs)
            errs.append(rel_err(outs, ref))
    finally:
        handle.remove()
    return finite, max(errs, default=0.0)


def _bisect_inputs(runner: MixedRunner, p: Any, rep: Report, gran: str) -> Report:
    """Which inputs fail in the low dtype, and for token sequences the shortest failing prefix."""
    failing = []
    prefixes: dict[str, int] = {}
    for i, kw in enumerate(runner.batches):
        out = runner.outputs(frozenset(), [kw])
        runner.runs += 1
        if out is not None and rel_err(out[0], runner.ref[i]) <= runner.rtol:
            continue
        failing.append(i)
        seq = _seq_len(kw)
        if seq and seq > 1:
            def fails(n: int, kw=kw, seq=seq) -> bool:
                cut = {k: (v[:, :n] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == seq else v)
                       for k, v in kw.items()}
                o = runner.outputs(frozenset(), [cut])
                runner.runs += 1
                return o is None or not all(bool(torch.isfinite(t).all()) for t in o[0])
            n = shortest_failing_prefix(seq, fails)
            if n is not None:
                prefixes[str(i)] = n
    rep.run["failed_inputs"] = failing
    rep.bisect = BisectResult(runner.dtype, runner.keep_dtype, [], runner.runs, not failing, None, gran,
                              failing_inputs=failing, shortest_failing_prefix=prefixes or None)
    if failing:
        rep.notes.append("failing inputs: " + ", ".join(f"#{i} {p.labels[i]}" for i in failing))
    return rep


def _seq_len(kw: dict) -> int | None:
    for k in ("input_ids", "inputs_embeds"):
        v = kw.get(k)
        if isinstance(v, torch.Tensor) and v.dim() >= 2:
            return int(v.shape[1])
    return None
