"""Forward hooks on every module (or only on blocks) that record tensor statistics per call.

``Recorder`` attaches the hooks and records ``Call``s and stats rows; it never changes a tensor,
so outputs with and without capture are bitwise identical, and hooks are removed on detach even
when forward raises. The public ``nan_hunter.watch`` (``session.Watch``) builds on it and adds
``report()``.

Levels: ``"modules"`` hooks every module; ``"blocks"`` hooks only the repeated children of the
model's main ModuleList and the root (the cheap always-on mode); ``"ops"`` adds per-op checks (a
TorchDispatchMode) that also see intermediates absorbed before a module output.

CUDA graphs: hooks run while a graph is captured, so the graph records the statistics launches
with the model's kernels (levels blocks and modules; ops reads results on the host and refuses
to run under capture).
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch import nn

from ..stats import TensorStats
from ..tree import float_tensors
from .blocks import main_blocks
from .records import Call, Refs
from .sink import StatsSink

LEVELS = ("blocks", "modules", "ops")


class Recorder:
    """Capture per-module statistics while the model runs."""

    def __init__(self, model: nn.Module, level: str = "blocks", retain: int = 4,
                 backend: str | None = None, device: Any = None):
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        self.model = model
        self.level = level
        self.retain = retain
        if device is None:
            p = next(iter(model.parameters()), None)
            device = p.device if p is not None else torch.device("cpu")
        self.sink = StatsSink(device, backend)
        self.calls: list[Call] = []
        self.param_rows: dict[str, Refs] = {}  # latest rows of each module's own params
        self._own: dict[str, list[tuple[str, torch.Tensor]]] = {}
        self._param_versions: dict[str, tuple[int, ...]] = {}
        self.retained: collections.deque = collections.deque(maxlen=max(1, retain))
        self._handles: list[Any] = []
        self._stack: list[int] = []
        self._count: dict[str, int] = {}
        self._seq = 0
        self._forward = -1  # root calls seen (each is one input of the data set)
        self._names = {m: n for n, m in model.named_modules()}
        self._ops = None
        self.op_records: list[Any] = []  # level "ops": ops that introduced a non-finite value
        self._params_all = [p for p in model.parameters() if not p.is_inference()]
        self._weights_at: dict[int, int] = {}  # forward -> weights_version() when it started

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        self.attach()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    def attach(self) -> None:
        if self._handles:
            return
        targets: list[tuple[str, nn.Module]]
        if self.level == "blocks":
            blocks = set(main_blocks(self.model))
            targets = [(n, m) for n, m in self.model.named_modules() if n == "" or n in blocks]
        else:
            targets = list(self.model.named_modules())
        try:
            for name, m in targets:
                self._handles.append(m.register_forward_pre_hook(self._pre(name), with_kwargs=True))
                self._handles.append(m.register_forward_hook(self._post(name), with_kwargs=True,
                                                             always_call=True))
        except BaseException:
            self.detach()
            raise
        if self.level == "ops":
            from .ops import OpWatch

            self._ops = OpWatch(self)
            self._ops.__enter__()

    def detach(self) -> None:
        if self._ops is not None:
            ops, self._ops = self._ops, None
            ops.__exit__(None, None, None)
            self.op_records = ops.records
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stack.clear()

    # -- hooks ------------------------------------------------------------------------------
    def _on_root_call(self, forward: int) -> None:
        """Called when a root forward starts (a session records its ambient context here)."""

    def _measure_all(self, *parts: tuple[Any, str]) -> Refs:
        """Measure the float tensors inside each (object, label prefix) in one batch."""
        items = [item for obj, prefix in parts for item in float_tensors(obj, prefix)]
        if self._ops is not None:  # the stats' own ops must not be seen by the op-level mode
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():
                return self._measure_flat(items)
        return self._measure_flat(items)

    def _measure_flat(self, items: list[tuple[str, torch.Tensor]]) -> Refs:
        if not items:
            return []
        rows = self.sink.measure_many([t for _, t in items])
        return [(label, r) for (label, _), r in zip(items, rows)]

    def _pre(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not self._stack:  # a root call: one input of the data set
                if self._ops is not None and self.sink.device.type == "cuda" \
                        and torch.cuda.is_current_stream_capturing():
                    raise RuntimeError(
                        "nan_hunter.watch(level='ops') reads every op's result on the host and cannot "
                        "run inside CUDA-graph capture; capture with level='blocks' or 'modules' "
                        "(report() re-runs the failing input at op level, outside the graph)")
                self._forward += 1
                self._count.clear()
                self.sink.forget_tensors()
                self._weights_at[self._forward] = self.weights_version()
                self.retained.append((self._forward, args, kwargs))
                self._on_root_call(self._forward)
            idx = self._count.get(name, 0)
            self._count[name] = idx + 1
            call = Call(len(self.calls), name, type(module).__name__, idx, len(self._stack),
                        self._stack[-1] if self._stack else None, self._forward)
            call.inputs = self._measure_all((args, "args"), (kwargs, ""))
            call.params = self._params(name, module)
            self.calls.append(call)
            self._stack.append(call.start)
        return hook

    def _params(self, name: str, module: nn.Module) -> Refs:
        """Rows of the module's own floating parameters and buffers: measured at its first call,
        and again whenever one changed in place since (an optimizer step between forwards of
        one capture), so every call is judged against the weights it actually used."""
        own = self._own.get(name)
        if own is None:
            named = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
            own = self._own[name] = [(pn, p.detach()) for pn, p in named if p is not None and p.is_floating_point()]
        versions = tuple(p._version for _, p in own) if own and not own[0][1].is_inference() else ()
        if name not in self.param_rows or versions != self._param_versions.get(name):
            self.param_rows[name] = self._measure_flat(own)
            self._param_versions[name] = versions
        return self.param_rows[name]

    def _post(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if not self._stack:
                return
            call = self.calls[self._stack.pop()]
            call.seq = self._seq
            self._seq += 1
            call.outputs = self._measure_all((output, ""))
        return hook

    def weights_version(self) -> int:
        """Sum of the parameters' version counters: it grows whenever any parameter is changed
        in place (an optimizer step), so a re-run can tell whether it still sees the weights
        a forward used."""
        return sum(p._version for p in self._params_all)

    def weights_changed_since(self, forward: int) -> bool:
        return forward in self._weights_at and self._weights_at[forward] != self.weights_version()

    # -- results ----------------------------------------------------------------------------
    def stats(self) -> list[TensorStats]:
        """Every stats row, read back from the device (again, when a CUDA graph wrote rows:
        each replay rewrites them)."""
        if self.sink.graph_rows:
            self.sink.refresh()
        return self.sink.rows()

    @property
    def n_forwards(self) -> int:
        return self._forward + 1
