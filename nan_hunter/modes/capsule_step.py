"""``nanhunter scan DIR/step-<k>``: rebuild a capsule's model and re-run its failing step on a
machine that never saw the job, then report it as a scan does.

Rebuild: the HF config in ``capsule.json`` with the transformers class it names (a
``PreTrainedModel`` subclass exported by ``transformers``; a config asking for its own code,
``auto_map``, is refused, and nothing runs with ``trust_remote_code``), or the ``arch`` factory
(``--arch`` overrides it), loaded strictly from ``model.safetensors`` in the dtypes the capsule
holds. Re-run under the harness's capture with the step's autocast and train/eval mode:

- forward: the forward;
- backward: the forward, then the backward from ``grad_outputs.safetensors`` (the gradients
  that reached the model's outputs, so the user's loss function is not needed);
- optimizer: a no-grad forward (the watch's step), each parameter's gradient set from
  ``optimizer.safetensors``, a fresh ``torch.optim`` optimizer of the recorded class and
  hyperparameters given the recorded state, and its ``step()`` captured.

The step runs behind the harness (``CapsuleMode``): captured at module level (gradients and the optimizer step
too), located by the one locate (with the capsule's optimizer state before the step), ``step`` =
k, the replay of the failing region for its phase and the diagnosis through the one assembler.
The capsule directory is only read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..capture.run import forward
from ..config import Config, as_config
from ..dtypes import RunDtype, UnknownDtype, autocast_of, canonical, step_precision, torch_dtype
from ..errors import BadInput, install_hint
from ..explain.weights_verdict import weights_section, weights_verdict
from ..kernels.compare import flat
from ..load.capsule import Capsule, read
from ..load.checkpoint import member, open_safetensors
from ..load.safetensors_header import show
from ..load.weights import scan_weights
from ..locate.backward_op import backward_roots
from ..locate.rerun import KeptSteps
from ..locate.training_phases import OptimizerPieces, constructor_hyperparameters
from ..model.build import build_from_arch, hub_offline, listed_keys, load_strict, quiet_while_loading
from ..model.execute import resolve_device, run_context
from ..model.prepare import Prepared
from ..report import Report
from ..tree import detached_copy
from .base import ModeBase
from .harness import run_mode
from .trace_pass import trace_for, trace_note

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..load.checkpoint import Checkpoint
    from ..locate.located import Located
    from ..locate.rerun import Rerun
    from ..model.prepare import Prepared
    from ..report import Report
    from .protocol import Capture


def scan_capsule(
    path: str,
    arch: str | None = None,
    device: str = "auto",
    stats: str = "fast",
    config: Config | None = None,
    progress: Callable[[str, int], None] | None = None,
    replay: bool = True,
    trace: Any = None,
) -> Report:
    """The scan report of capsule ``path`` (a ``step-<k>`` directory): rebuilt, then its step run
    behind the harness like any mode (options the capsule fixes are refused by ``ScanOptions``)."""

    cfg = as_config(config)  # (stats: checked by ScanOptions)
    cap = read(path, arch_given=bool(arch))
    for name in {"capsule.json", "model.safetensors", "inputs.safetensors", *cap.files}:
        member(cap.path, name, f"capsule {cap.path}")  # symlinks must stay inside the capsule
    ck = open_safetensors(cap.path / "model.safetensors", "capsule weights")
    ws = scan_weights(ck, exact=stats == "full", progress=progress)
    checkpoint = describe(cap, ck)
    rep = Report(checkpoint=checkpoint, weights=weights_section(ws, cfg))
    dev = resolve_device(device)
    model, how = build(cap, ck, arch, dev)
    checkpoint["capsule"]["built_from"] = (
        f"{cap.meta.get('model_class')} config" if how == "config" else f"--arch {how}"
    )
    rep.notes.append(
        f"capsule of step {cap.step} ({cap.phase} fault): model rebuilt from "
        + (f"its {cap.meta.get('model_class')} config" if how == "config" else f"--arch {how}")
        + ", re-run on this machine"
    )
    step = CapsuleStep(cap, model, dev)
    rep.notes += step.notes
    p = Prepared(ck, model, None, how, [step.kwargs], [f"capsule step-{cap.step}"], step.run_dtype, dev, cfg)
    mode = CapsuleMode(step)
    # ``scan --trace``: the step's forward traced in the same pass as its capture (modes.trace_pass)
    tracer = trace_for(p, mode, trace) if trace is not None else None
    run_mode(p, mode, rep, replay, tracer)
    if tracer is not None:
        rep.notes.append(trace_note(tracer, trace, len(p.batches)))
    if rep.first_nonfinite is None:
        rep.notes.append(
            f"the capsule's step {cap.step} re-ran without a non-finite value on this machine "
            f"({cap.phase} phase): the fault did not reproduce (a nondeterministic kernel, other hardware "
            "or library versions: the capsule was written with "
            + ", ".join(f"{k} {v}" for k, v in (cap.meta.get("versions") or {}).items())
            + ")"
        )
        if ws.nonfinite:
            weights_verdict(rep, cfg)
    return rep


class CapsuleMode(ModeBase):
    """A capsule's failing step (forward, backward or optimizer) as a mode of one input."""

    name = "capsule"

    def __init__(self, step: CapsuleStep) -> None:
        self.step = step

    @property
    def grad(self) -> bool:  # type: ignore[override]
        return self.step.cap.phase == "backward"

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        return flat(self.step.forward_fn())

    def optimizer(self, p: Prepared) -> Any:
        return self.step.optimizer() if self.step.cap.phase == "optimizer" else None

    def groups(self, p: Prepared, indices: list[int]) -> list[list[int]]:
        return [[0]]

    def run_group(self, p: Prepared, group: list[int], recorder: Any) -> dict[str, Any]:
        kw = p.batches[0]  # a trace's --repeat re-runs the step's forward only (its optimizer steps once)
        recorder.input_run(
            0,
            lambda: self.step.run(recorder),
            again=lambda: forward(
                p.model, kw, p.run, lambda: self.run_input(p.model, kw, recorder), grad=self.grad
            ),
        )
        return {"optimizer_steps": recorder.optimizer.steps if recorder.optimizer is not None else None}

    def failed_of(self, p: Prepared, cap: Capture) -> list[int]:
        return [0] if cap.recording.failed else []

    def rerun(self, p: Prepared, cap: Capture) -> Rerun:
        # at the capsule's own dtype (fp8 emulation re-applied), with its optimizer state before the step
        return KeptSteps(
            cap.recorder, cap.keep.contexts, self.step.watch_dtype, optimizer=self.step.optimizer_pieces
        )

    def place(self, p: Prepared, cap: Capture, loc: Located) -> None:
        loc.first.step, loc.first.input_index = self.step.cap.step, 0  # the training step the capsule holds
        loc.input_label = p.labels[0]

    def merge(self, extras: list[dict[str, Any]]) -> dict[str, Any]:
        return extras[0] if extras else {}

    def finish(self, p: Prepared, rep: Report, extra: dict[str, Any], located: Located | None) -> None:
        import torch

        cap = self.step.cap
        assert rep.run is not None  # protocol.fill sets it before finish
        rep.run.backward = cap.phase == "backward"
        rep.run.autocast = autocast_of(self.step.autocast, torch.device(p.device).type)
        if located is not None:
            rep.run.optimizer_steps = extra.get("optimizer_steps")


def describe(cap: Capsule, ck: Checkpoint) -> dict[str, Any]:
    m = cap.meta
    return {
        "path": str(cap.path),
        "format": "capsule",
        "n_tensors": ck.n_tensors,
        "bytes": ck.nbytes,
        "capsule": {
            "phase": cap.phase,
            "step": cap.step,
            "model_class": m.get("model_class"),
            "arch": m.get("arch"),
            "dtype": m.get("dtype"),
            "autocast": m.get("autocast"),
            "training": m.get("training"),
            "files": cap.files,
            "optimizer": (m.get("optimizer") or {}).get("class"),
            "versions": m.get("versions"),
        },
    }


# --- rebuilding the model ------------------------------------------------------------------------


def build(cap: Capsule, ck: Checkpoint, arch: str | None, device: Any) -> tuple[Any, str]:
    """(model, how): from ``--arch`` if given, else the capsule's HF config, else its arch; weights
    loaded strictly, each parameter and buffer in the dtype the capsule stored it in."""

    spec = arch or (None if isinstance(cap.meta.get("config"), dict) else cap.meta.get("arch"))
    if spec:
        model, how = build_from_arch(spec, ck), spec
    else:
        model, how = _from_config(cap), "config"
        _strict_keys(model, ck, cap)
    _match_dtypes(model, ck)
    load_strict(model, ck)  # again, now in the stored dtypes: bit-exact weights
    return model.to(device), how


def _from_config(cap: Capsule) -> Any:

    meta = cap.meta
    where = f"{cap.path / 'capsule.json'}"
    cfg = meta["config"]
    if "auto_map" in cfg or cfg.get("custom_pipelines"):
        raise BadInput(
            f"{where}: the model's config asks for its own code (auto_map) that nanhunter does not run; "
            "to run model code you trust, pass --arch file.py:factory"
        )
    name = meta.get("model_class")
    if not isinstance(name, str) or not name.isidentifier():
        raise BadInput(
            f"{where}: model_class {show(name)} is not a transformers class name; pass --arch "
            "file.py:factory to build the model"
        )
    hub_offline()
    try:
        import transformers
    except ImportError:
        raise BadInput(
            f"rebuilding this capsule's model needs transformers: {install_hint('hf')} (or pass --arch)"
        ) from None
    cls = getattr(transformers, name, None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise BadInput(
            f"{where}: model_class {show(name)} is not a model class of transformers "
            f"{transformers.__version__}; pass --arch file.py:factory to build the model"
        )
    transformers.utils.logging.set_verbosity_error()
    with quiet_while_loading():
        try:
            if cls.config_class is None:
                raise TypeError(f"{name} has no config_class")
            config = cls.config_class.from_dict(dict(cfg))
            return cls._from_config(config)
        except Exception as e:
            raise BadInput(
                f"{where}: transformers could not build {name} from the capsule's config "
                f"({type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''})"
            ) from None


def _strict_keys(model: Any, ck: Checkpoint, cap: Capsule) -> None:
    expected, have = set(model.state_dict()), set(ck.names())
    missing, unexpected = sorted(expected - have), sorted(have - expected)
    if missing or unexpected:
        parts = ([f"missing {len(missing)} keys ({listed_keys(missing)})"] if missing else []) + (
            [f"unexpected {len(unexpected)} keys ({listed_keys(unexpected)})"] if unexpected else []
        )
        raise BadInput(
            f"{cap.path / 'model.safetensors'}: weights do not match the {cap.meta.get('model_class')} "
            f"built from the capsule's config: {'; '.join(parts)}; pass --arch file.py:factory for "
            "the model this capsule came from"
        )


def _match_dtypes(model: Any, ck: Checkpoint) -> None:
    """Each floating parameter and buffer to the dtype the capsule stored it in (an fp16 model
    stays fp16, an fp32 norm kept in a bf16 model stays fp32); tied weights are cast once."""
    import torch

    dtypes = {}
    for name in ck.names():
        e = ck.entry(name)
        dt = e.torch_dtype() if e is not None else ck.tensor(name).dtype
        if dt is not None:
            dtypes[name] = dt
    named = list(model.named_parameters(remove_duplicate=False)) + list(
        model.named_buffers(remove_duplicate=False)
    )
    with torch.no_grad():
        for name, t in named:
            want = dtypes.get(name)
            if (
                t is not None
                and want is not None
                and t.is_floating_point()
                and want.is_floating_point
                and t.dtype != want
            ):
                t.data = t.data.to(want)


# --- re-running the step ---------------------------------------------------------------------------


class CapsuleStep:
    """The capsule's failing step, ready to re-run under a watch and to re-run again for replays."""

    def __init__(self, cap: Capsule, model: Any, device: Any) -> None:
        import torch

        self.cap, self.model, self.device = cap, model, device
        self.notes: list[str] = []
        meta = cap.meta
        p = cap.path
        inputs = _tensors(p / "inputs.safetensors", device)
        other = (meta.get("inputs") or {}).get("other") or {}
        if not isinstance(other, dict):
            raise BadInput(
                f"{p / 'capsule.json'}: inputs.other must be an object of argument names to values"
            )
        merged = {**inputs, **other}
        n_args = 0
        while f"args.{n_args}" in merged:
            n_args += 1
        self.args = tuple(merged.pop(f"args.{i}") for i in range(n_args))
        self.kwargs = {k: v for k, v in merged.items() if not k.startswith("args.")}
        dropped = (meta.get("inputs") or {}).get("dropped") or []
        if dropped:
            self.notes.append(
                f"the step's non-tensor argument(s) {', '.join(map(str, dropped))} could not be stored in "
                "the capsule and were left out of the re-run"
            )
        self.grads = (
            list(_tensors(p / "grad_outputs.safetensors", device).items())
            if "grad_outputs.safetensors" in cap.files
            else None
        )
        if cap.phase == "backward" and not self.grads:
            raise BadInput(
                f"{p}: a backward capsule needs grad_outputs.safetensors (the gradients at the model's "
                "outputs); it is missing from the capsule's files"
            )
        self.autocast = _autocast(meta.get("autocast"), p)
        self.training = meta.get("training")
        dt = meta.get("dtype")
        param = next((t.dtype for t in model.parameters() if t.is_floating_point()), torch.float32)
        try:
            self.watch_dtype = RunDtype.of(dt) if isinstance(dt, str) else None
        except ValueError:
            raise BadInput(f"{p / 'capsule.json'}: dtype {show(dt)} is not a run dtype") from None
        # what the step computed in: the watch's dtype, else the autocast dtype (an fp16 overflow
        # under autocast is measured against fp16's max, not the fp32 parameters'), else the parameters'
        self.run_dtype = step_precision(self.watch_dtype, self.autocast, None, param) or RunDtype.of("fp32")
        self.optimizer_pieces: OptimizerPieces | None = None
        if cap.phase == "optimizer":
            self.optimizer_pieces = self._optimizer_pieces(
                open_safetensors(p / "optimizer.safetensors", "capsule optimizer state")
            )

    # -- the context of the step ---------------------------------------------------------------
    @contextlib.contextmanager
    def context(self, grad: bool) -> Any:
        import torch

        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.set_grad_enabled(grad))
            for dev, dt in self.autocast:
                stack.enter_context(torch.autocast(dev, dtype=dt))
            stack.enter_context(run_context(self.watch_dtype))
            if isinstance(self.training, bool):
                self.model.train(self.training)
            yield

    def forward_fn(self) -> Any:
        """One forward of the step from fresh copies of its inputs; with grad only for a forward
        fault whose step ran with grad (``nn.MultiheadAttention`` takes another path without)."""

        a, kw = detached_copy((self.args, self.kwargs))
        with self.context(grad=self.cap.phase == "forward" and self.cap.meta.get("grad") is True):
            return self.model(*a, **kw)

    def train_fn(self) -> None:
        """The step's forward and its backward from the recorded output gradients. Gradients are
        returned by ``autograd.grad``, never accumulated in ``.grad``."""
        import torch

        a, kw = detached_copy((self.args, self.kwargs))
        with self.context(grad=True):
            out = self.model(*a, **kw)
        roots, gs = backward_roots(out, self.grads or [])
        if roots:
            params = [q for q in self.model.parameters() if q.requires_grad]
            torch.autograd.grad(roots, params, gs, allow_unused=True)

    # -- the re-run under capture ------------------------------------------------------------------
    def run(self, recorder: Any) -> None:
        """The step run once under ``recorder`` (installed: module-level capture, gradients and the
        optimizer step too); a failure is bad input naming the capsule."""
        import torch

        torch.manual_seed(0)  # dropout in a train-mode step: the capsule holds no RNG state
        phase = self.cap.phase
        opt = recorder.optimizer.optimizer if recorder.optimizer is not None else None
        try:
            if phase == "backward":
                with self.context(grad=True):
                    out = self.model(*self.args, **self.kwargs)
                roots, gs = backward_roots(out, self.grads or [])
                if not roots:
                    raise BadInput(
                        f"{self.cap.path}: none of the recorded output gradients "
                        f"({', '.join(k for k, _ in self.grads or [])}) matches an output of the "
                        "rebuilt model's forward; the capsule does not fit this model"
                    )
                torch.autograd.backward(roots, gs)
            else:
                self.forward_fn()
                if opt is not None:
                    opt.step()
        except BadInput:
            raise
        except Exception as e:
            msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            raise BadInput(
                f"{self.cap.path}: re-running the capsule's step raised {type(e).__name__}: {msg}; "
                "check that the model is built as when the capsule was written (--arch)"
            ) from None

    # -- the optimizer ---------------------------------------------------------------------------
    def _optimizer_pieces(self, ock: Checkpoint) -> OptimizerPieces:
        import torch

        meta = self.cap.meta.get("optimizer")
        where = self.cap.path / "capsule.json"
        if not isinstance(meta, dict):
            raise BadInput(
                f"{where}: an optimizer capsule needs an 'optimizer' object (class, hyperparameters)"
            )
        name, module = meta.get("class"), meta.get("module")
        cls = getattr(torch.optim, name, None) if isinstance(name, str) and name.isidentifier() else None
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or (
            isinstance(module, str) and not module.startswith("torch.optim")
        ):
            raise BadInput(
                f"{where}: optimizer {show(name)} (module {show(module)}) is not a torch.optim optimizer; "
                "nanhunter rebuilds only torch.optim classes"
            )
        hyper, groups = meta.get("hyperparameters"), meta.get("groups")
        if (
            not isinstance(hyper, list)
            or not all(isinstance(h, dict) for h in hyper)
            or not isinstance(groups, dict)
            or not all(isinstance(g, int) and 0 <= g < len(hyper) for g in groups.values())
        ):
            raise BadInput(
                f"{where}: optimizer.hyperparameters must be a list of objects and optimizer.groups map "
                "parameter names to indices into it"
            )

        hp = [constructor_hyperparameters(cls, h) for h in hyper]
        params = dict(self.model.named_parameters())
        grads: dict[str, torch.Tensor] = {}
        state: dict[str, dict[str, torch.Tensor]] = {}
        for key in ock.names():
            kind, _, rest = key.partition("/")
            if kind == "grad":
                grads[rest] = ock.tensor(key).to(self.device)
            elif kind == "state" and "/" in rest:
                pname, _, sk = rest.rpartition("/")
                state.setdefault(pname, {})[sk] = ock.tensor(key).to(self.device)
        unknown = sorted((set(grads) | set(state) | set(groups)) - set(params))
        if unknown:
            raise BadInput(
                f"{self.cap.path / 'optimizer.safetensors'}: parameter(s) {', '.join(map(show, unknown[:4]))} "
                "are not parameters of the rebuilt model"
            )
        return OptimizerPieces(
            cls,
            hp,
            {n: g for n, g in groups.items() if n in grads},
            {n: params[n].detach().clone() for n in grads},  # as before the step
            grads,
            state,
        )

    def optimizer(self) -> Any:
        """A fresh optimizer over the recorded parameters, grouped and configured as recorded,
        with the recorded gradients and state (parameters without a gradient take no step)."""
        import torch

        o = self.optimizer_pieces
        assert o is not None
        params = dict(self.model.named_parameters())
        for p in self.model.parameters():
            p.grad = None
        groups: list[list[str]] = [[] for _ in o.hyper]
        for n, g in o.groups.items():
            groups[g].append(n)
        for n in o.grads:
            if n not in o.groups:
                groups[0].append(n)
        spec = [
            {"params": [params[n] for n in names], **o.hyper[i]} for i, names in enumerate(groups) if names
        ]
        if not spec:
            raise BadInput(
                f"{self.cap.path / 'optimizer.safetensors'}: no parameter gradients in it; nothing to step"
            )
        try:
            opt = o.cls(spec)
        except Exception as e:
            raise BadInput(
                f"{self.cap.path / 'capsule.json'}: {o.cls.__name__} could not be rebuilt from the "
                f"recorded hyperparameters ({type(e).__name__}: {e})"
            ) from None
        with torch.no_grad():
            for n in (n for names in groups for n in names):
                p = params[n]
                if o.grads[n].shape != p.shape:
                    raise BadInput(
                        f"{self.cap.path / 'optimizer.safetensors'}: the gradient of {show(n)} has shape "
                        f"{list(o.grads[n].shape)}, the parameter {list(p.shape)}"
                    )
                p.grad = o.grads[n].to(p.dtype)
                if n in o.state:
                    opt.state[p] = {k: v.clone() for k, v in o.state[n].items()}
        return opt


def _tensors(path: Path, device: Any) -> dict[str, Any]:

    ck = open_safetensors(path, "capsule file")
    return {n: ck.tensor(n).to(device) for n in ck.names()}


def _autocast(spec: Any, p: Path) -> list[tuple[str, Any]]:
    import torch

    out = []
    for item in spec or []:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)) or item[
            0
        ] not in ("cpu", "cuda"):
            raise BadInput(
                f"{p / 'capsule.json'}: autocast entries must be [device, dtype] with device cpu or cuda, "
                f"got {show(item)}"
            )
        if item[0] == "cuda" and not torch.cuda.is_available():
            raise BadInput(
                f"{p}: the step ran under CUDA autocast; re-run the capsule on a machine with a CUDA device "
                "(--device cuda)"
            )
        try:
            out.append((item[0], torch_dtype(canonical(item[1]))))
        except (UnknownDtype, KeyError, ValueError):
            raise BadInput(
                f"{p / 'capsule.json'}: autocast dtype {show(item[1])} is not a dtype nanhunter knows"
            ) from None
    return out
