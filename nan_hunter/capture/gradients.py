"""Backward capture: statistics of every gradient flowing through every hooked module.

Tensor hooks, not module backward hooks: ``register_full_backward_hook`` wraps outputs in a
custom Function and breaks models that modify a module output in place (``ReLU(inplace=True)``
after a norm); a tensor hook changes nothing and never raises. For each forward call:

- the forward post-hook puts a hook on each output that requires grad: the gradient reaching the
  call (the backward call's *input*);
- the forward pre-hook puts one on each input that requires grad: the gradient the call produced
  w.r.t. that input (an *output* of the backward call);
- a hook on each parameter (once, at attach) gives its whole gradient for that backward pass,
  recorded as an output of the backward of the owner's latest call.

Every gradient goes through the same sink and kernel as forward tensors (no host sync per hook on
a device). Hooks return None: gradients are never changed. Each backward pass queues one
callback at its end (``on_backward_end``) where the recorder judges the steps it touched. The
gradients that reached the root's outputs are kept by reference for the latest steps (never
copied): a report re-runs the failing step's backward from them without knowing the user's loss.
"""

from __future__ import annotations

from typing import Any

import torch

from .records import Call


def _needs_grad(t: torch.Tensor) -> bool:
    return t.requires_grad and not t.is_inference()


class GradientHooks:
    """The backward half of a ``Recorder`` (``Recorder(backward=True)``)."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.calls: dict[int, dict[int, Call]] = {}  # forward -> forward call start -> backward call
        self.events = 0  # gradients seen so far, in the order autograd produced them
        self.root_grads: dict[
            int, list[tuple[str, torch.Tensor]]
        ] = {}  # forward -> grads at the root outputs
        self.last_call: dict[str, Call] = {}  # module -> its latest forward call (owner of param grads)
        self.touched: set[int] = set()  # forwards whose backward ran since the last end callback
        # parameter -> (data_ptr, shape, version, row, forward) of the gradient its hook measured
        self.param_grad_rows: dict[str, tuple[int, tuple, int, int, int]] = {}
        self._queued = False
        self._handles: list[Any] = []  # parameter hooks
        self._hooked: set[tuple[int, str]] = set()  # (id(parameter), module) already hooked
        self._lazy = False
        self._own: Any = None
        self._leaf: dict[int, list[Any]] = {}  # forward -> hooks on leaf inputs (they outlive the graph)

    # -- attach ----------------------------------------------------------------------------
    def attach(self, targets: list[tuple[str, torch.nn.Module]], own: Any) -> None:
        """One hook per parameter that requires grad, on behalf of each target that owns it
        (``own(name, module)``: the (name, parameter) pairs a call of that module is judged on)."""
        self._own = own
        for name, module in targets:
            for pname, p in own(name, module):
                self._hook_param(name, pname, p)
        # FSDP2 swaps sharded DTensor parameters for gathered ones around each forward, and
        # autograd accumulates into the gathered ones: hook those as calls see them
        self._lazy = any(type(p).__name__ == "DTensor" for p in self.rec.model.parameters())

    def _hook_param(self, name: str, pname: str, p: torch.Tensor) -> None:
        if isinstance(p, torch.nn.Parameter) and p.requires_grad and (id(p), name) not in self._hooked:
            self._hooked.add((id(p), name))
            self._handles.append(p.register_hook(self._param_hook(name, pname)))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._hooked.clear()
        for hs in self._leaf.values():
            for h in hs:
                h.remove()
        self._leaf.clear()

    def grad_row(self, name: str, grad: torch.Tensor, forward: int) -> int | None:
        """The row this backward measured ``grad`` (parameter ``name``'s ``.grad``) in, if it is
        that very gradient, unchanged (no accumulation since)."""
        hit = self.param_grad_rows.get(name)
        if hit is None or hit[4] != forward or forward not in self.calls:
            return None
        if (grad.data_ptr(), tuple(grad.shape), grad._version) != hit[:3]:
            return None
        return hit[3]

    def forget(self, forward: int) -> None:
        """A forward was folded away: drop its backward records' index and its hooks on leaves."""
        self.calls.pop(forward, None)
        for k in [k for k, v in self.param_grad_rows.items() if v[4] == forward]:
            del self.param_grad_rows[k]
        self.root_grads.pop(forward, None)
        for h in self._leaf.pop(forward, []):
            h.remove()

    # -- forward side ------------------------------------------------------------------------
    def on_inputs(
        self, call: Call, items: list[tuple[str, torch.Tensor]], module: torch.nn.Module | None = None
    ) -> None:
        """A call started; ``items``: the floating tensors of its arguments, labelled as capture
        labels them (``capture.floats.float_items``)."""
        self.last_call[call.module] = call
        if not torch.is_grad_enabled():
            return
        if self._lazy and module is not None:
            for pname, p in self._own(call.module, module):
                self._hook_param(call.module, pname, p)
        for label, t in items:
            if _needs_grad(t):
                self._hook(call, t, f"grad of input {label}", incoming=False)

    def on_outputs(self, call: Call, items: list[tuple[str, torch.Tensor]]) -> None:
        """A call ended; ``items``: the floating tensors of its output."""
        if not torch.is_grad_enabled():
            return
        for label, t in items:
            if _needs_grad(t):
                self._hook(call, t, label, incoming=True)

    def _hook(self, call: Call, t: torch.Tensor, label: str, incoming: bool) -> None:
        try:
            h = t.register_hook(self._tensor_hook(call, label, incoming))
        except RuntimeError:  # a tensor autograd does not track after all: nothing flows back through it
            return
        if t.is_leaf:  # a leaf keeps its hooks: remove them when the forward is folded
            self._leaf.setdefault(call.input_index, []).append(h)

    def _tensor_hook(self, call: Call, label: str, incoming: bool):
        def hook(grad: torch.Tensor) -> None:
            if grad is not None and not self.rec.paused:
                self.record(call, f"grad of {label}" if incoming else label, grad, incoming)
            return None

        return hook

    def _param_hook(self, module: str, pname: str):
        def hook(grad: torch.Tensor) -> None:
            if grad is None or self.rec.paused:
                return None
            call = self.last_call.get(module)
            if call is not None:
                refs = self.record(call, f"grad of {pname}", grad, incoming=False)
                if refs:  # the optimizer step reads this gradient again as .grad: same storage, same version
                    full = f"{module}.{pname}" if module else pname
                    self.param_grad_rows[full] = (
                        grad.data_ptr(),
                        tuple(grad.shape),
                        grad._version,
                        refs[0][1],
                        call.input_index,
                    )
            return None

        return hook

    # -- recording ---------------------------------------------------------------------------
    def record(self, call: Call, label: str, grad: torch.Tensor, incoming: bool) -> list[tuple[str, int]]:
        """One gradient of ``call``'s backward: measured into the sink, kept on the backward call."""
        rec = self.rec
        f = call.input_index
        detail = rec.calls_of(f)
        if detail is None:  # the forward was folded before its backward ran (more micro-batches than retain)
            return []
        per = self.calls.setdefault(f, {})
        bc = per.get(call.start)
        if bc is None:
            bc = per[call.start] = Call(
                call.start,
                call.module,
                call.module_type,
                call.call_index,
                call.depth,
                call.parent,
                f,
                phase="backward",
            )
            detail.append(bc)
        refs = rec.measure([(label, grad.detach() if grad.requires_grad else grad)], step=f)
        if incoming:
            bc.inputs += refs
            if call.parent is None:
                if f not in self.root_grads:  # kept by reference for the latest step and those a report needs
                    for k in [k for k in self.root_grads if not rec.grads_needed(k)]:
                        del self.root_grads[k]
                self.root_grads.setdefault(f, []).append((label.removeprefix("grad of "), grad))
        else:
            bc.outputs += refs
            bc.order += [self.events] * len(refs)
            if bc.seq < 0:
                bc.seq = self.events
        self.events += 1
        self.touched.add(f)
        if not self._queued:
            self._queued = True
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._end)
            except RuntimeError:  # not inside a backward pass (a hook fired by hand): judged later
                self._queued = False
        return refs

    def _end(self) -> None:
        self._queued = False
        touched, self.touched = sorted(self.touched), set()
        self.rec.on_backward_end(touched)
