"""The torch side of bisect: runs the model with a keep set in high precision and feeds the pure
search (``search.py``) with pass/fail verdicts and the producer of each failing run."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..capture.blocks import main_blocks
from ..capture.recorder import Recorder
from ..capture.targeted import first_call_order
from ..config import Config, as_config
from ..dtypes import RunDtype
from ..errors import BadInput
from ..explain.assemble import run_info
from ..explain.keep_fix import output_error
from ..explain.weights_verdict import weights_section
from ..kernels.compare import compare
from ..load.checkpoint import open_checkpoint
from ..load.weights import scan_weights
from ..locate.producer import first_finding
from ..model.execute import cast_batch, run_context
from ..model.policy import apply_policy, install_hooks, set_precision, write_policy
from ..model.prepare import prepare, run_dtype
from ..modes.failing_prefix import shortest_failing_prefix
from ..modes.registry import mode_for
from ..report import BisectResult, Report
from .keep_in_fp32 import is_transformers_model, try_keep_in_fp32
from .options import BisectOptions
from .search import minimal_keep_set

if TYPE_CHECKING:  # pragma: no cover
    from ..modes.harness import Mode


def candidates_of(
    model: nn.Module, run: Callable[[], Any], granularity: str, blamed: str | None = None
) -> list[str]:
    """What bisect may keep, in the order of first call: leaf modules (``leaf``), or the repeated
    blocks plus the leaf modules outside them — embeddings, the final norm, the head (``block``).
    ``blamed``, the module a low-precision run blames, is added when it is not a leaf: an op
    written in its own forward (LlamaAttention's q·kᵀ) is fixed only by keeping it."""
    order = first_call_order(model, run)
    leaves = {n for n, m in model.named_modules() if n and not any(True for _ in m.children())}
    if granularity == "block":
        blocks = main_blocks(model)
        if not blocks:
            raise BadInput("--granularity block: this model has no repeated ModuleList of blocks; use leaf")
        inside = tuple(b + "." for b in blocks)
        wanted = set(blocks) | {n for n in leaves if not n.startswith(inside)}
    else:
        wanted = set(leaves)
    if blamed and blamed not in wanted and not any(blamed.startswith(w + ".") for w in wanted):
        wanted.add(blamed)
    elif blamed and blamed not in wanted and granularity == "leaf":
        wanted.add(blamed)
    return [n for n in order if n in wanted]


class MixedRunner:
    """Runs every input with a keep set in ``keep_dtype`` and the rest in ``dtype``."""

    def __init__(
        self, model: nn.Module, batches: list[dict], run: RunDtype, keep: RunDtype, rtol: float, mode: Mode
    ):
        self.model = model
        self.batches = batches
        self.run = run
        self.keep = keep
        self.dtype = run.name
        self.keep_dtype = keep.name
        self.rtol = rtol
        self.mode = mode  # what one input runs (modes.harness): a forward, a decoding, forward and backward
        self.backward = mode.grad  # a run passes only when its gradients are finite too
        # full-precision master weights (as loaded), to restore kept modules without rounding
        self.master = {
            k: v.detach().clone()
            for k, v in model.state_dict(keep_vars=False).items()
            if v.is_floating_point()
        }
        self.ref: list[list[torch.Tensor]] = []
        self.runs = 0
        self.last_max_err = math.nan

    def _configure(self, keep: frozenset[str] | set[str]) -> list[Any]:
        pol = {m: self.keep_dtype for m in keep}
        set_precision(self.model, self.run, pol, self.master)
        return install_hooks(self.model, self.run, pol)

    def _inputs(self, kw: dict, run: RunDtype) -> dict:
        return cast_batch(
            kw, run, next(iter(self.master.values())).device if self.master else torch.device("cpu")
        )

    def outputs(
        self, keep: frozenset[str] | set[str], batches: list[dict] | None = None, all_high: bool = False
    ) -> list[list[torch.Tensor]] | None:
        """Outputs per input, or None when the forward raised (a dtype mismatch counts as failing)."""
        got = self.observe(keep, batches, all_high)
        return None if got is None else got[0]

    def observe(
        self, keep: frozenset[str] | set[str], batches: list[dict] | None = None, all_high: bool = False
    ) -> tuple[list[list[torch.Tensor]], str | None] | None:
        """Outputs per input and the producer of the first non-finite module output (None when
        every module output stayed finite), from one captured run; None when the forward raised.
        Every module output counts, not only the model's: T5 clamps its hidden states, so a
        run can end finite after a module went inf."""

        if all_high:
            set_precision(self.model, self.keep, {}, self.master)
            handles: list[Any] = []
            run = self.keep
        else:
            handles = self._configure(keep)
            run = self.run
        res = []
        rec = Recorder(self.model, level="modules", retain=1, backward=self.backward)
        try:
            with rec, torch.set_grad_enabled(self.backward), run_context(run):
                for kw in batches if batches is not None else self.batches:
                    res.append(self.mode.run_input(self.model, self._inputs(kw, run), rec))
        except RuntimeError:
            return None
        finally:
            for h in handles:
                h.remove()
        f = first_finding(rec.calls, rec.sink.rows())
        return res, (None if f is None else f.call.module)

    def reference(self) -> bool:
        got = self.observe(frozenset(), all_high=True)
        self.runs += 1
        if got is None:
            return False
        self.ref, producer = got
        return producer is None and all(all(bool(torch.isfinite(t).all()) for t in o) for o in self.ref)

    def passes(self, keep: frozenset[str]) -> tuple[bool, str | None]:
        """Whether the run with ``keep`` kept high is finite in every module output and within
        ``rtol`` of the reference; for a failing run, its first producer (a search hint)."""
        self.runs += 1
        got = self.observe(keep)
        if got is None:
            self.last_max_err = math.inf
            return False, None
        outs, producer = got
        err = max((output_error(o, r) for o, r in zip(outs, self.ref)), default=0.0)
        self.last_max_err = err
        if producer is None and err <= self.rtol:
            return True, None
        return False, producer


def bisect(
    checkpoint: str,
    config: str | Config | None = None,
    progress: Callable[[int, str], None] | None = None,
    **options: Any,
) -> Report:
    """The bisect report of ``checkpoint``; ``options`` are ``BisectOptions`` fields (``dtype``,
    ``keep_dtype``, ``prompts``, ``granularity``, ``generate``, ``backward``...), validated before
    anything is loaded. ``generate``: judge each run by greedy decoding of that many tokens per
    input (a run fails when any module output of any step goes non-finite) instead of by one
    forward. ``backward``: a run also needs a finite backward of the loss (the model's own for a
    causal LM, or ``loss``, ``file.py:fn``): modules are kept until forward and backward are finite."""
    return run_bisect(BisectOptions(checkpoint, **options), as_config(config), progress)


def run_bisect(
    opts: BisectOptions, cfg: Config, progress: Callable[[int, str], None] | None = None
) -> Report:
    """A validated bisect (``BisectOptions``) under configuration ``cfg``."""
    dt, keep, over = opts.dtype, opts.keep_dtype, opts.over
    gran, tol = opts.resolved(cfg)
    ck = open_checkpoint(opts.checkpoint)
    rep = Report(checkpoint=ck.describe(), mode="bisect", weights=weights_section(scan_weights(ck), cfg))
    # Prepare at the kept (high) precision; the runner casts per query from these master weights.
    p = prepare(
        ck,
        opts.arch,
        list(opts.inputs) or None,
        list(opts.prompts) or None,
        opts.data,
        keep,
        opts.device,
        cfg,
        opts.attn,
        need_model=True,
    )
    if p is None or not p.batches:
        raise BadInput("bisect needs inputs: pass --inputs, --prompt or --data")
    rep.notes += p.notes  # e.g. the default prompt, announced as in scan
    mode = mode_for(generate=opts.generate, backward=opts.backward, loss=opts.loss)
    mode.check(p)
    runner = MixedRunner(p.model, p.batches, run_dtype(dt, cfg), run_dtype(keep, cfg), tol, mode)
    rep.run = run_info(runner.run, p.device, len(p.batches), [], inputs=list(p.labels))
    if not runner.reference():
        rep.bisect = BisectResult(dt, keep, [], runner.runs, False, None, gran, over=over)
        rep.notes.append(
            f"the run is non-finite even with everything in {keep}: no precision policy can fix it; "
            f"run `nanhunter scan --dtype {keep}` to find the cause"
        )
        return rep
    if over == "inputs":
        return _bisect_inputs(runner, p, rep, gran)
    # The all-low run: already fine? Else its producer joins the candidates if it is not a leaf.
    low_ok, blamed = runner.passes(frozenset())
    if low_ok:
        rep.bisect = BisectResult(
            dt, keep, [], runner.runs, True, runner.last_max_err, gran, over=over, already_finite=True
        )
        rep.notes.append(
            f"the run in {dt} is already finite in every module output and within rtol {tol:g} of "
            f"{keep}: nothing needs to be kept in {keep}"
        )
        return rep
    cands = candidates_of(p.model, lambda: runner.outputs(frozenset()), gran, blamed)
    runner.runs += 1
    if progress is not None:
        progress(runner.runs, f"{len(cands)} candidate modules")

    def holder(prod: str | None) -> str | None:
        """The innermost candidate holding the producer (keeping it keeps the producer)."""
        inside = [c for c in cands if prod is not None and (prod == c or prod.startswith(c + ".") or c == "")]
        return max(inside, key=len) if inside else None

    def passes(k: frozenset[str]) -> tuple[bool, str | None]:
        if not k:  # the all-low run above already answered this one
            return False, holder(blamed)
        ok, prod = runner.passes(k)
        if progress is not None:
            progress(runner.runs, f"kept {len(k)} → {'pass' if ok else 'fail'}")
        return ok, holder(prod)

    res = minimal_keep_set(cands, passes, hint=holder(blamed))
    if not res.solvable or res.keep is None:
        rep.bisect = BisectResult(
            dt, keep, [], runner.runs, False, None, gran, res.bound, len(cands), over=over
        )
        rep.notes.append("keeping every candidate in high precision still fails the tolerance")
        return rep
    # Verification: the policy applied the public way, on a fresh copy of the model.
    finite_after, err = verify(p.model, runner, list(res.keep))
    runner.runs += 1
    failed = [
        i
        for i, o in enumerate(runner.outputs(frozenset()) or [])
        if not all(bool(torch.isfinite(t).all()) for t in o)
    ]
    rep.run["failed_inputs"] = failed
    # transformers' own mechanism only where loading with it was tried on this architecture and worked
    kif = None
    if keep == "fp32" and finite_after and is_transformers_model(p.model) and ck.format == "hf":
        worked, line = try_keep_in_fp32(str(ck.path), p.model, list(res.keep), runner.run, runner.batches)
        kif = list(res.keep) if worked else None
        rep.notes.append(line)
    rep.bisect = BisectResult(
        dt,
        keep,
        list(res.keep),
        runner.runs,
        finite_after,
        err,
        gran,
        res.bound,
        len(cands),
        over=over,
        keep_in_fp32_modules=kif,
    )
    if opts.policy_out:
        write_policy(opts.policy_out, dt, keep, list(res.keep))
    return rep


def verify(model: nn.Module, runner: MixedRunner, keep: list[str]) -> tuple[bool, float | None]:
    """The policy applied the public way (``apply_policy``) on a fresh copy of the model, each
    input run by the bisected mode under capture: finite in every module output (and gradient,
    for ``--backward``), and the largest relative error against the reference (None under
    ``--generate``: decoding is judged on finiteness alone)."""

    m = copy.deepcopy(model)
    m.load_state_dict({**m.state_dict(), **runner.master})
    set_precision(m, runner.keep, {}, runner.master)
    handle = apply_policy(
        m,
        {
            "dtype": runner.dtype,
            "keep_dtype": runner.keep_dtype,
            "modules": {k: runner.keep_dtype for k in keep},
        },
    )
    errs = []
    rec = Recorder(m, level="modules", retain=1, backward=runner.backward)
    try:
        with rec, torch.set_grad_enabled(runner.backward), run_context(runner.run):
            for kw, ref in zip(runner.batches, runner.ref):
                outs = runner.mode.run_input(m, runner._inputs(kw, runner.run), rec)
                if outs or ref:
                    errs.append(output_error(outs, ref))
    finally:
        handle.remove()
    finite = first_finding(rec.calls, rec.sink.rows()) is None and rec.first_failed is None
    return finite, (max(errs, default=0.0) if runner.mode.compares_outputs else None)


def _bisect_inputs(runner: MixedRunner, p: Any, rep: Report, gran: str) -> Report:
    """Which inputs fail in the low dtype, and for token sequences the shortest failing prefix."""
    failing = []
    prefixes: dict[str, int] = {}
    for i, kw in enumerate(runner.batches):
        got = runner.observe(frozenset(), [kw])
        runner.runs += 1
        if got is not None and got[1] is None and compare(got[0][0], runner.ref[i]).error <= runner.rtol:
            continue
        failing.append(i)
        seq = _seq_len(kw)
        if seq and seq > 1:

            def fails(n: int, kw=kw, seq=seq) -> bool:
                cut = {
                    k: (v[:, :n] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == seq else v)
                    for k, v in kw.items()
                }
                o = runner.observe(frozenset(), [cut])
                runner.runs += 1
                return (
                    o is None or o[1] is not None or not all(bool(torch.isfinite(t).all()) for t in o[0][0])
                )

            n = shortest_failing_prefix(seq, fails)
            if n is not None:
                prefixes[str(i)] = n
    assert rep.run is not None  # run_bisect sets it before the inputs are bisected
    rep.run["failed_inputs"] = failing
    rep.bisect = BisectResult(
        runner.dtype,
        runner.keep_dtype,
        [],
        runner.runs,
        not failing,
        None,
        gran,
        failing_inputs=failing,
        shortest_failing_prefix=prefixes or None,
        over="inputs",
    )
    if failing:
        rep.notes.append("failing inputs: " + ", ".join(f"#{i} {p.labels[i]}" for i in failing))
    return rep


def _seq_len(kw: dict) -> int | None:
    for k in ("input_ids", "inputs_embeds"):
        v = kw.get(k)
        if isinstance(v, torch.Tensor) and v.dim() >= 2:
            return int(v.shape[1])
    return None
