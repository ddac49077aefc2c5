"""The keep-in-higher-precision fix as an artifact (contract v1.4): the smallest set of modules
that, kept in fp32 by a policy (``model.policy``), makes the whole model's outputs finite and
within ``rtol`` of fp32 on the failing input.

It is found by the search ``nanhunter bisect`` runs (``model.keep_search``), over the same
candidates (leaf modules in first-call order, plus the blamed module when it is not a leaf)
with the same verdict (every module output finite, the outputs within ``rtol`` of the all-fp32
run), so scan's fix and bisect's answer agree. The set found is then applied the public way —
``apply_policy`` on a fresh copy of the model — and judged on the model's outputs; the kept
modules whose output did not fit the run's dtype (and so stayed in fp32, carried on by torch's
type promotion) are named, so the fix can say where activations return to the run's dtype.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..capture.recorder import Recorder
from ..capture.targeted import first_call_order
from ..dtypes import RunDtype
from ..kernels.compare import compare
from ..locate.producer import first_finding
from ..model.execute import run_context
from ..model.keep_search import minimal_keep_set
from ..model.policy import apply_policy, install_hooks, set_precision
from ..model.whole import WholeModel
from ..tree import cast_floats, detached_copy, float_tensors

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

#: the most runs the search may make in a scan (bisect itself is unbounded: it is the command's job)
MAX_RUNS = 48


@dataclass
class KeepFix:
    """A keep set found and verified. ``policy``: what ``apply_policy`` takes; ``stayed_high``: kept
    modules whose output did not fit the run's dtype in the verification run (it stayed fp32)."""

    keep: list[str]
    runs: int
    finite: bool
    max_rel_err: float | None
    policy: dict[str, Any]
    stayed_high: list[str] = field(default_factory=list)


def output_error(outs: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """The largest relative error of any one output against its reference (``compare`` per output):
    judged jointly, a KV cache of large values would hide a wrong logits tensor behind its scale
    (q·k ×1000 in bf16: logits 0.46 off, the joint error 0.01). inf on a structure difference."""
    if len(outs) != len(ref):
        return float("inf")
    return max((compare([o], [r]).error for o, r in zip(outs, ref)), default=0.0)


def _outs(out: Any) -> list[torch.Tensor]:
    return [t.detach() for _, t in float_tensors(out)]


def _finite(ts: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts)


class _Runner:
    """One copy of the model, cast per query from full-precision master weights (as bisect's
    ``MixedRunner``; ``WholeModel.weights``: the checkpoint's, not the run's rounded copy): the keep
    set in ``keep``, the rest in ``run``."""

    def __init__(self, whole: WholeModel, run: RunDtype, keep: RunDtype):
        self.run, self.keep, self.whole = run, keep, whole
        self.master = {k: v.detach().to(keep.torch_compute).clone() for k, v in whole.weights().items()}
        self.model = copy.deepcopy(whole.model).train(whole.training)
        self.device = next(iter(self.master.values())).device if self.master else torch.device("cpu")
        self.runs = 0

    def forward(self, m: nn.Module, at: RunDtype) -> Any:
        """``m`` on copies of the step's inputs cast to ``at`` (the step's RNG put in place first)."""
        return run_whole(self.whole, m, at, self.device)

    def observe(self, keep: frozenset[str] | None) -> tuple[list[torch.Tensor], str | None] | None:
        """Outputs and the first module whose output went non-finite (None: none did); None when
        the forward raised (a dtype mismatch downstream counts as failing, as in bisect)."""
        self.runs += 1
        if keep is None:  # the all-high reference
            set_precision(self.model, self.keep, {}, self.master)
            handles: list[Any] = []
            at = self.keep
        else:
            pol = {m: self.keep.name for m in keep}
            set_precision(self.model, self.run, pol, self.master)
            handles = install_hooks(self.model, self.run, pol)
            at = self.run
        rec = Recorder(self.model, level="modules", retain=1)
        try:
            with rec, torch.no_grad(), run_context(at):
                outs = _outs(self.forward(self.model, at))
        except RuntimeError:
            return None
        finally:
            for h in handles:
                h.remove()
        f = first_finding(rec.calls, rec.sink.rows())
        return outs, (None if f is None else f.call.module)


def candidates(model: nn.Module, runner: _Runner, blamed: str | None) -> list[str]:
    """bisect's ``leaf`` candidates: leaf modules in first-call order, plus ``blamed`` when it is
    not a leaf (an op written in its own forward is fixed only by keeping it)."""
    order = first_call_order(runner.model, lambda: runner.observe(frozenset()))
    leaves = {n for n, m in model.named_modules() if n and not any(True for _ in m.children())}
    wanted = set(leaves)
    if blamed:
        wanted.add(blamed)
    return [n for n in order if n in wanted]


def run_whole(whole: WholeModel, m: nn.Module, at: RunDtype, device: Any) -> Any:
    """``m`` (a copy of ``whole.model``) run on fresh copies of the step's inputs cast to ``at`` (a
    KV cache among them is copied, never grown)."""
    args, kwargs = cast_floats(detached_copy((whole.args, whole.kwargs)), at.torch_compute, device)
    return whole.call(m, args, kwargs)


def find_keep_set(
    whole: WholeModel,
    run: RunDtype,
    blamed: str | None,
    rtol: float,
    keep_dtype: str = "fp32",
    max_runs: int = MAX_RUNS,
) -> KeepFix | None:
    """The smallest keep set for the step's inputs (see the module docstring), verified on a fresh
    copy with ``apply_policy``; None when the all-``keep_dtype`` run is itself non-finite, the search
    finds no set within ``max_runs``, or keeping every candidate still fails."""
    keep_run = RunDtype.of(keep_dtype)
    model = whole.model
    runner = _Runner(whole, run, keep_run)
    ref = runner.observe(None)
    if ref is None or ref[1] is not None or not _finite(ref[0]):
        return None
    ref_outs = ref[0]
    cands = candidates(model, runner, blamed)

    def holder(prod: str | None) -> str | None:
        inside = [c for c in cands if prod is not None and (prod == c or prod.startswith(c + "."))]
        return max(inside, key=len) if inside else None

    class _OutOfRuns(Exception):
        pass

    def passes(k: frozenset[str]) -> tuple[bool, str | None]:
        if runner.runs >= max_runs:
            raise _OutOfRuns
        got = runner.observe(k)
        if got is None:
            return False, None
        outs, prod = got
        err = output_error(outs, ref_outs)
        return (prod is None and err <= rtol), holder(prod)

    try:
        res = minimal_keep_set(cands, passes, hint=holder(blamed))
    except _OutOfRuns:
        return None
    if not res.solvable or not res.keep:
        return None
    policy = {"dtype": run.name, "keep_dtype": keep_dtype, "modules": {m: keep_dtype for m in res.keep}}
    finite, err, high = verify_policy(whole, runner.master, run, policy, ref_outs)
    return KeepFix(
        list(res.keep), runner.runs + 1, finite and err is not None and err <= rtol, err, policy, high
    )


def verify_policy(
    whole: WholeModel,
    master: dict[str, torch.Tensor],
    run: RunDtype,
    policy: dict[str, Any],
    ref: list[torch.Tensor],
) -> tuple[bool, float | None, list[str]]:
    """``policy`` applied the public way (``apply_policy``) to a fresh copy of the model at full
    precision, run on the step's inputs: (outputs finite, max rel err against ``ref``, kept modules
    whose output stayed in the kept dtype because it did not fit the run's)."""
    m = copy.deepcopy(whole.model).train(whole.training)
    set_precision(m, RunDtype.of(policy["keep_dtype"]), {}, master)  # the model as loaded, at full precision
    handle = apply_policy(m, policy)
    high: list[str] = []
    watchers = []
    for name in policy["modules"]:

        def seen(mod: Any, args: Any, out: Any, name: str = name) -> None:
            if any(t.dtype != run.torch_compute for t in _outs(out)) and name not in high:
                high.append(name)

        watchers.append(m.get_submodule(name).register_forward_hook(seen))  # after the policy's own hook
    try:
        with torch.no_grad(), run_context(run):
            outs = _outs(run_whole(whole, m, run, next(iter(master.values())).device))
    except RuntimeError:
        return False, None, high
    finally:
        for w in watchers:
            w.remove()
        handle.remove()
    if not _finite(outs):
        return False, None, high
    err = output_error(outs, ref)
    return True, (err if err != float("inf") else None), high
