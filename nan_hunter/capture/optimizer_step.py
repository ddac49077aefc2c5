"""Optimizer capture: every parameter before and after ``optimizer.step()``.

``register_step_pre_hook`` measures each parameter that has a gradient, and its gradient;
``register_step_post_hook`` measures the parameter again. Each parameter of the step becomes one
``Call`` of phase ``"optimizer"`` (inputs: parameter and gradient before, output: parameter
after; ``seq`` its position in ``param_groups`` order), so locate finds the first parameter that
a step turned non-finite from finite values by the same rule as any other phase. Nothing is
copied: statistics only. A step the GradScaler skips never calls ``optimizer.step()``.
"""

from __future__ import annotations

from typing import Any

import torch

from .records import Call
from .sentinel import any_nonfinite, float_tensors_of, nonfinite_flag, optimizer_state_tensors


def parameter_owners(model: torch.nn.Module) -> dict[int, tuple[str, str, str]]:
    """id(parameter) -> (dotted name, owning module, its type), first name wins (tied weights)."""
    out: dict[int, tuple[str, str, str]] = {}
    for mname, m in model.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            if id(p) not in out:
                out[id(p)] = (f"{mname}.{pname}" if mname else pname, mname, type(m).__name__)
    return out


def _plain(t: torch.Tensor) -> torch.Tensor:
    """The tensor itself (so the sink's identity cache can recognise it), detached only when it
    is part of a graph (``create_graph=True``)."""
    return t.detach() if t.requires_grad else t


def _grad(p: torch.Tensor) -> torch.Tensor:
    """``_plain`` of a parameter's gradient (``OptimizerHooks.params`` keeps only parameters that have one)."""
    assert p.grad is not None
    return _plain(p.grad)


class OptimizerHooks:
    """The optimizer half of a ``Recorder`` (``Recorder(optimizer=opt)``)."""

    def __init__(self, rec: Any, optimizer: Any) -> None:
        if not hasattr(optimizer, "register_step_pre_hook") or not hasattr(optimizer, "param_groups"):
            raise TypeError(f"optimizer= takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.rec = rec
        self.optimizer = optimizer
        self.owners = parameter_owners(rec.model)
        self.steps = 0  # optimizer.step() calls seen
        self._handles: list[Any] = []
        self._pending: (
            tuple[int, list[tuple[torch.Tensor, str, str, str]], list[tuple[str, int]] | None] | None
        ) = None

    def attach(self) -> None:
        self._handles = [
            self.optimizer.register_step_pre_hook(self._pre),
            self.optimizer.register_step_post_hook(self._post),
        ]

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def params(self) -> list[tuple[torch.Tensor, str, str, str]]:
        """(parameter, name, owner, owner type) of every parameter with a gradient, in
        ``param_groups`` order."""
        out = []
        for gi, group in enumerate(self.optimizer.param_groups):
            for j, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                name, owner, otype = self.owners.get(id(p), (f"param_groups[{gi}][{j}]", "", "?"))
                out.append((p, name, owner, otype))
        return out

    def _pre(self, optimizer: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        self._pending = None
        # the wrapper torch puts around step() passes (optimizer, *step's arguments)
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure):
            self._before()
            return None

        first = [True]

        def measured_closure() -> Any:
            # step(closure) (Lightning, LBFGS): the forward and backward run inside the step, so the
            # parameters and gradients are measured once the first call of the closure has run,
            # before any update (LBFGS calls it again between its own updates)
            out = closure()
            if first[0]:
                first[0] = False
                self._before()
            return out

        if "closure" in kwargs:
            return args, {**kwargs, "closure": measured_closure}
        return (args[0], measured_closure, *args[2:]), kwargs

    def _before(self) -> None:
        rec = self.rec
        self._pending = None
        f = rec.current_step
        if rec.paused or f < 0 or rec.calls_of(f) is None:
            return
        items = self.params()
        if rec.sentinel:  # nothing measured before the step: parameters and gradients were judged finite
            self._pending = (f, items, None)
            rec.on_optimizer_start(f, self)
            return
        # a parameter the forward measured, unchanged since, and a gradient the backward measured,
        # the very storage autograd then stored as .grad, are not read again
        known = [rec.param_row(n, p, f) for p, n, _, _ in items]
        fresh = rec.measure(
            [(f"{n} before the step", p.detach()) for (p, n, _, _), k in zip(items, known) if k is None],
            step=f,
        )
        it = iter(fresh)
        before = [
            (f"{n} before the step", k) if k is not None else next(it)
            for (_, n, _, _), k in zip(items, known)
        ]
        seen = [rec.grads.grad_row(n, p.grad, f) if rec.grads is not None else None for p, n, _, _ in items]
        fresh = rec.measure(
            [(f"grad of {n}", _grad(p)) for (p, n, _, _), k in zip(items, seen) if k is None], step=f
        )
        it = iter(fresh)
        grads = [(f"grad of {n}", k) if k is not None else next(it) for (_, n, _, _), k in zip(items, seen)]
        refs = before + grads
        self._pending = (f, items, refs)
        rec.on_optimizer_start(f, self)

    def _post(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        self.steps += 1
        pending, self._pending = self._pending, None
        rec = self.rec
        if pending is None or rec.paused:
            return
        f, items, refs = pending
        detail = rec.calls_of(f)
        if detail is None:
            return
        if refs is None:
            self._sentinel_post(f, items, detail)
            return
        after = rec.measure([(f"{n} after the step", p.detach()) for p, n, _, _ in items], step=f)
        rec.measured_after_step([p for p, _, _, _ in items], after, f)  # the next forward's parameter rows
        n = len(items)
        calls = []
        for i, (_, name, owner, otype) in enumerate(items):
            c = Call(
                rec.next_start(),
                owner,
                otype,
                0,
                0,
                None,
                f,
                inputs=[refs[i], refs[n + i]],
                outputs=[after[i]],
                seq=i,
                phase="optimizer",
                param=name,
            )
            calls.append(c)
        detail.extend(calls)
        rec.on_optimizer_end(f, calls)

    def _sentinel_post(
        self, f: int, items: list[tuple[torch.Tensor, str, str, str]], detail: list[Call]
    ) -> None:
        """Sentinel: every parameter and optimizer-state tensor after the step, judged by one fused
        reduction and one read. Only a step that made one non-finite is measured, one ``Call`` per
        parameter (inputs: its gradient, judged finite after backward; outputs: the parameter and
        its state after the step), so locate finds the first parameter by the usual rule."""
        rec = self.rec
        params = [p for p, _, _, _ in items]
        states = optimizer_state_tensors(self.optimizer, params)
        tensors = float_tensors_of(params + [v for st in states for _, v in st])
        flag = nonfinite_flag(tensors)
        grads = rec.take_grad_flag()  # a device: the backward's flag, read here with this one
        if grads is not None:
            flag = grads[1] if flag is None else flag | grads[1].to(flag.device)
        if flag is None or not bool(flag):  # the step's one read-back
            rec.on_optimizer_end(f, [])
            return
        if grads is not None and bool(grads[1]):
            rec.measure_gradients(grads[0])
            if not any_nonfinite(tensors):  # the gradients alone: a backward fault
                rec.on_optimizer_end(f, [])
                return
        calls = []
        for i, ((p, name, owner, otype), st) in enumerate(zip(items, states)):
            ins = rec.measure([(f"grad of {name}", _grad(p))], step=f)
            outs = rec.measure(
                [(f"{name} after the step", p.detach())] + [(f"{k} of {name}", v) for k, v in st], step=f
            )
            calls.append(
                Call(
                    rec.next_start(),
                    owner,
                    otype,
                    0,
                    0,
                    None,
                    f,
                    inputs=ins,
                    outputs=outs,
                    seq=i,
                    phase="optimizer",
                    param=name,
                )
            )
        detail.extend(calls)
        rec.on_optimizer_end(f, calls)
