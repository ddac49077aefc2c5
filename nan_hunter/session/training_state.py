"""What a ``watch(backward=True, optimizer=..., scaler=..., capsule_dir=...)`` adds to a report.

- Weights at the fault: when the first fault is known (end of the forward, end of the backward,
  after the optimizer step), the weights the step ran with are copied once, so a report can
  re-run the step after later optimizer steps changed them. For an optimizer fault they come
  from the pre-step copy, which is only taken with ``capsule_dir`` (one copy of the parameters,
  their gradients and optimizer state per step; without a capsule nothing is copied and the
  optimizer fault is explained from the state after the step).
- GradScaler: a backward pass with non-finite gradients is a skipped step, not a fault, when the
  same backward without loss scaling is finite: decided by one re-run of that step with the
  gradients at the outputs divided by the scale (``locate.backward_op``), before the next step
  or at ``report()``. Skipped steps are listed in ``run.scaler_skipped_steps``.
- The capsule (``capsule.write``) at the first fault.
- ``WatchRerun``: the watch's re-runs for ``locate`` (the weights of the failing step, the
  optimizer's pre-step state, the optimizer facts read right after the failing step).
"""

from __future__ import annotations

import platform
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..capture.compiled_regions import eager_only
from ..load.capsule import write as write_capsule
from ..locate.backward_op import rerun_backward
from ..locate.producer import first_finding
from ..locate.rerun import KeptSteps
from ..locate.training_phases import OptimizerPieces, constructor_hyperparameters, optimizer_facts
from ..model.execute import weights_copy
from ..model.whole import WholeModel
from ..report import Report
from ..version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from ..capture.context import ForwardContext
    from ..capture.recorder import Recorder
    from ..dtypes import RunDtype
    from ..serving.tracker import PackedBatches


class TrainingHost(Protocol):
    """What ``TrainingState`` reads and calls on the watch it serves (a ``session.Watch``): its
    recording's steps, rows and hooks, the contexts and precision they ran in, a re-run of a step."""

    model: Any
    grads: Any
    optimizer: Any
    sink: Any
    paused: bool
    run: RunDtype | None
    first_failed: int | None
    window: int
    late_phases: bool

    @property
    def contexts(self) -> Mapping[int, ForwardContext]: ...

    def calls_of(self, step: int) -> list[Any] | None: ...
    def inputs_of(self, forward: int) -> Any: ...
    def mark_late_fault(self, f: int, phase: str) -> None: ...
    def weights_changed_since(self, forward: int) -> bool: ...
    def step_forward(self, input_index: int) -> Any: ...
    def state_kept(self) -> Any: ...
    def step_label(self, forward: int) -> int: ...


class RerunHost(Protocol):
    """What ``WatchRerun`` needs of a watch: its recorder and kept contexts, its precision, what
    training kept (weights at the fault, the optimizer's pre-step state) and the user's state."""

    recorder: Recorder
    run: RunDtype | None
    training: TrainingState
    optimizer: Any
    serving: PackedBatches

    @property
    def contexts(self) -> Mapping[int, ForwardContext]: ...

    def state_kept(self) -> Any: ...


def _enabled(scaler: Any) -> bool:
    try:
        return bool(scaler.is_enabled())
    except AttributeError:
        return True


def _scale_of(scaler: Any) -> Any:
    """The scaler's current scale without a host sync (a device tensor copy, or its initial value)."""
    s = getattr(scaler, "_scale", None)
    if isinstance(s, torch.Tensor):
        return s.detach().clone()
    return float(getattr(scaler, "_init_scale", 1.0))


class TrainingState:
    def __init__(self, watch: TrainingHost, scaler: Any, capsule_dir: str | None, arch: str | None) -> None:
        self.w = watch
        self.scaler = scaler if scaler is not None and _enabled(scaler) else None
        self.capsule_dir = capsule_dir
        self.arch = arch
        self.scaler_skipped: list[int] = []
        self.pending: set[int] = set()  # steps whose verdict waits for an unscaled re-run
        self._verdict: dict[int, bool] = {}
        self._scales: dict[int, Any] = {}
        self.fault_state: dict[str, torch.Tensor] | None = None
        self.fault_step: int | None = None
        self.pre_step: dict[str, Any] | None = None
        self.capsule: str | None = None
        self.notes: list[str] = []
        self.optimizer_facts: dict[str, Any] | None = None  # read right after the failing step

    def _facts_now(self, f: int) -> dict[str, Any] | None:
        """Optimizer state and gradient of the first parameter the step ``f`` made non-finite, as
        they are right after that step (later steps overwrite them)."""
        w = self.w
        hooks = w.optimizer
        if hooks is None:
            return None
        calls = [c for c in (w.calls_of(f) or []) if c.phase == "optimizer"]
        rows = w.sink.rows()
        found = first_finding(calls, rows)
        if found is None or found.call.param is None:
            return None
        param = dict((n, p) for p, n, _, _ in hooks.params()).get(found.call.param)
        return optimizer_facts(hooks.optimizer, param, found.call.param) if param is not None else None

    # -- during the run ----------------------------------------------------------------------
    def on_step(self, forward: int) -> None:
        if self.scaler is not None:
            self._scales[forward] = _scale_of(self.scaler)
            for k in [k for k in self._scales if k < forward - self.w.window and k not in self.pending]:
                del self._scales[k]
        if self.pending:
            self.settle()

    def accept(self, forward: int, phase: str) -> bool:
        if phase != "backward" or self.scaler is None:
            return True
        if forward in self._verdict:
            return self._verdict[forward]
        self.pending.add(forward)
        return False

    def settle(self) -> None:
        """Decide the pending GradScaler steps: a fault only if unscaled gradients are non-finite too."""
        for f in sorted(self.pending):
            self.pending.discard(f)
            real = self._unscaled_nonfinite(f)
            if real is None:
                self.notes.append(
                    f"step {f}: gradients were non-finite under the GradScaler but the step could not "
                    "be re-run without loss scaling (inputs or weights no longer kept); counted as a "
                    "fault"
                )
                real = True
            self._verdict[f] = real
            if real:
                self.w.mark_late_fault(f, "backward")
            else:
                self.scaler_skipped.append(f)

    def _unscaled_nonfinite(self, f: int) -> bool | None:
        w = self.w
        grads = w.grads.root_grads.get(f) if w.grads else None
        fwd = w.step_forward(f)
        if grads is None or fwd is None or w.weights_changed_since(f):
            return None
        scale = self._scales.get(f, 1.0)
        scale = float(scale) if isinstance(scale, torch.Tensor) else scale
        at_outputs = [g for _, g in grads if not bool(torch.isfinite(g).all())]
        if at_outputs:  # scale × a finite gradient overflows to ±inf, never to NaN
            return any(bool(torch.isnan(g).any()) for g in at_outputs)
        was = w.paused
        w.paused = True
        try:
            with w.state_kept():
                finite, _ = rerun_backward(w.model, fwd, grads, scale=scale)
        finally:
            w.paused = was
        return not finite

    def on_first_fault(self, forward: int, phase: str) -> None:
        w = self.w
        # the weights of the failing step, copied once, in every training loop (a forward run with grad
        # on, parameters that require grad): a report explains the leaf and op after an optimizer step
        # changed them (one copy of the state, once per run). Not for no-grad runs (the CLI's scans,
        # generate()): their weights stay, and a copy of a big checkpoint would double its memory.
        ctx = w.contexts.get(forward)
        trains = (
            ctx is not None
            and ctx.grad
            and not ctx.inference
            and any(p.requires_grad for p in w.model.parameters())
        )
        if not w.late_phases and not self.capsule_dir and not trains:
            return
        if phase == "optimizer":
            pre = self.pre_step if self.pre_step and self.pre_step["step"] == forward else None
            state = pre["weights"] if pre else None
        elif self._sharded() and not self.capsule_dir:
            # FSDP2: state_dict() in the middle of a step runs FSDP's hooks on this rank alone (a
            # collective the other ranks do not join), and a report re-runs on gathered weights
            state = None
        elif w.weights_changed_since(forward):
            state = None
        else:
            with torch.inference_mode(
                False
            ):  # a copy made under inference_mode would have no version counter
                state = weights_copy(w.model)
        self.fault_state, self.fault_step = state, forward
        if phase == "optimizer":
            self.optimizer_facts = self._facts_now(forward)
        if self.capsule_dir:
            try:
                self._write_capsule(self.capsule_dir, forward, phase)
            except Exception as e:  # noqa: BLE001 - the user's training must go on; the report says why
                self.notes.append(f"the capsule for step {forward} was not written: {type(e).__name__}: {e}")

    def _sharded(self) -> bool:
        return any(type(p).__name__ == "DTensor" for p in self.w.model.parameters())

    def before_optimizer_step(self, forward: int, hooks: Any) -> None:
        if not self.capsule_dir or self.w.first_failed is not None:
            return
        items = hooks.params()
        opt = hooks.optimizer
        self.pre_step = {
            "step": forward,
            "weights": weights_copy(self.w.model),
            "grads": {n: p.grad.detach().clone() for p, n, _, _ in items},
            "state": {
                n: {
                    k: v.detach().clone()
                    for k, v in opt.state.get(p, {}).items()
                    if isinstance(v, torch.Tensor)
                }
                for p, n, _, _ in items
            },
            "groups": {
                n: next(i for i, g in enumerate(opt.param_groups) if any(q is p for q in g["params"]))
                for p, n, _, _ in items
            },
        }

    def weights_at_fault(self, forward: int) -> dict[str, torch.Tensor] | None:
        return self.fault_state if self.fault_step == forward else None

    # -- the capsule ---------------------------------------------------------------------------
    def _write_capsule(self, capsule_dir: str, f: int, phase: str) -> None:
        w = self.w
        snap = w.inputs_of(f)
        if snap is None or self.fault_state is None:
            self.notes.append(
                f"the capsule for step {f} was not written: the step's "
                f"{'inputs' if snap is None else 'weights'} were no longer kept"
            )
            return
        ctx = w.contexts.get(f)
        model = w.model
        config = getattr(model, "config", None)
        meta: dict[str, Any] = {
            "phase": phase,
            "dtype": w.run.name if w.run is not None else None,
            "param_dtype": str(next((p.dtype for p in model.parameters()), torch.float32)).removeprefix(
                "torch."
            ),
            "autocast": [[dev, str(dt).removeprefix("torch.")] for dev, dt in (ctx.autocast if ctx else ())],
            "grad": bool(ctx.grad) if ctx else True,
            "training": ctx.training if ctx else model.training,
            "loss": {"kind": "grad_outputs" if w.grads is not None else "none"},
            "versions": {
                "nanhunter": __version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
            },
        }
        if config is not None and hasattr(config, "to_dict"):
            meta["config"] = config.to_dict()
            meta["model_class"] = type(model).__name__
            try:
                import transformers

                meta["versions"]["transformers"] = transformers.__version__
            except ImportError:  # pragma: no cover - a config without transformers
                pass
        if self.arch:
            meta["arch"] = self.arch
        grads = w.grads.root_grads.get(f) if w.grads else None
        opt = None
        if phase == "optimizer" and self.pre_step is not None and w.optimizer is not None:
            o = w.optimizer.optimizer
            opt = {
                "class": type(o).__name__,
                "module": type(o).__module__,
                "hyperparameters": [_hyper(g) for g in o.param_groups],
                "groups": self.pre_step["groups"],
                "grads": self.pre_step["grads"],
                "state": self.pre_step["state"],
            }
        args, kwargs = snap.rerun()
        path = write_capsule(
            capsule_dir,
            w.step_label(f),
            weights=self.fault_state,
            args=args,
            kwargs=kwargs,
            meta=meta,
            grad_outputs=[(k, g) for k, g in grads] if grads else None,
            optimizer=opt,
        )
        self.capsule = str(path)
        import logging

        logging.getLogger("nan_hunter").warning(
            "nanhunter: wrote the capsule of step %s to %s (replay it with: nanhunter scan %s)",
            w.step_label(f),
            path,
            shlex.quote(str(path)),
        )

    # -- the report ----------------------------------------------------------------------------
    def finish(self, rep: Report) -> None:
        """What training adds to a watch's report: its notes (steps a GradScaler skipped, the
        capsule written)."""
        rep.notes += [n for n in self.notes if n not in rep.notes]
        if self.scaler_skipped:
            rep.notes.append(
                f"GradScaler skipped step(s) {sorted(self.scaler_skipped)}: the scaled gradients "
                "overflowed while the same backward without loss scaling is finite — loss scaling "
                "backing off, not a fault"
            )
        if self.capsule:
            rep.notes.append(
                f"capsule of the failing step written to {self.capsule} "
                f"(replay it with: nanhunter scan {shlex.quote(self.capsule)})"
            )


class WatchRerun(KeptSteps):
    """A watch's re-runs (``locate.rerun``): its kept steps, with the weights of the failing step
    (copied at the fault when an optimizer step may change them), the optimizer's state before
    the failing step (kept with ``capsule_dir``) and the optimizer facts read right after it."""

    def __init__(self, watch: RerunHost) -> None:
        super().__init__(watch.recorder, watch.contexts, watch.run)
        self.w = watch

    def weights(self, step: int) -> dict[str, torch.Tensor] | None:
        return self.w.training.weights_at_fault(step)

    def optimizer(self, step: int) -> OptimizerPieces | None:
        t, hooks = self.w.training, self.w.optimizer
        pre = t.pre_step if t.pre_step and t.pre_step["step"] == step else None
        if pre is None or hooks is None:
            return None
        opt = hooks.optimizer
        cls = type(opt)
        return OptimizerPieces(
            cls,
            [constructor_hyperparameters(cls, g) for g in opt.param_groups],
            pre["groups"],
            pre["weights"],
            pre["grads"],
            pre["state"],
        )

    def optimizer_facts(self, step: int, param: str | None) -> dict[str, Any] | None:
        t = self.w.training
        facts = t.optimizer_facts
        if t.fault_step == step and facts is not None and facts.get("param") == param:
            return facts
        return None

    def kept(self) -> Any:
        return self.w.state_kept()

    def whole(self, step: int) -> WholeModel | None:
        """The whole model on the step's kept inputs, for its fix check on a fresh copy (contract v1.4
        scope "model"): as the step ran — the weights it used, its train/eval mode, its RNG (dropout).
        None (the failing module is checked alone, and the report says so) when the inputs are not
        kept, under autocast (a copy cast to the autocast dtype is not the run the user made), for a
        packed serving batch, for a sharded model or under torch.distributed (a wrapped or sharded
        model cannot be copied whole)."""
        snap, ctx = self.inputs(step), self.context(step)
        dist = torch.distributed.is_available() and torch.distributed.is_initialized()
        packed = (
            step in self.w.serving.packed
        )  # a packed serving batch: its inputs hold the whole paged cache
        if snap is None or ctx.autocast or dist or packed or self.w.training._sharded():
            return None
        args, kwargs = snap.rerun()
        training = ctx.training if ctx.training is not None else self.model.training
        # compiled submodules of the copy run eagerly, as every re-run of the watch does
        return WholeModel(self.model, args, kwargs, self.weights(step), training, ctx.seed, around=eager_only)


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in group.items():
        if k == "params":
            continue
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = float(v)
        if isinstance(v, tuple):
            v = list(v)
        if isinstance(v, (int, float, bool, str, list)) or v is None:
            out[k] = v
    return out
