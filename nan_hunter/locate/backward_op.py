"""The op-level step of location for backward faults: re-run the failing step's forward and
backward from what capture kept, and name the first aten op of the backward that made a
non-finite gradient from finite operands, with its autograd node and the forward line that
created that node.

The backward is started from the gradients that reached the model's outputs in the original
step (``capture.gradients`` keeps them by reference), so the user's loss function is not needed:
outputs whose gradient came through another output (``logits`` feeding ``loss``) are left out, so
nothing is counted twice. ``torch.autograd.grad`` returns the gradients instead of adding them to
``.grad``: the user's gradients are never touched. The forward re-runs under anomaly mode, which
records where each autograd node was created.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..capture.ops import FirstBadOp, OpEvent
from ..tree import float_tensors

Grads = list[tuple[str, torch.Tensor]]


def _reaches(starts: list[Any], target: Any) -> bool:
    seen: set[int] = set()
    todo = list(starts)
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        if node is target:
            return True
        seen.add(id(node))
        todo.extend(n for n, _ in node.next_functions)
    return False


def backward_roots(
    out: Any, grads: Grads, scale: float | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(outputs, gradients) to start a backward from: the re-run's outputs matched by label with
    the gradients the original step gave them, leaving out outputs upstream of another one.
    ``scale``: divide the gradients by it first (in float32, then back to their dtype): the same
    backward without a GradScaler's loss scaling."""
    tensors = dict(float_tensors(out, ""))
    pairs = [(tensors[label], g) for label, g in grads if label in tensors and tensors[label].requires_grad]
    nodes = [t.grad_fn for t, _ in pairs]
    roots, gs = [], []
    for i, (t, g) in enumerate(pairs):
        others = [n for j, n in enumerate(nodes) if j != i and n is not None and n is not t.grad_fn]
        if t.grad_fn is not None and _reaches(others, t.grad_fn):
            continue
        if scale is not None:
            g = (g.float() / scale).to(g.dtype)
        roots.append(t)
        gs.append(g.to(t.device) if g.shape == t.shape else g.expand_as(t).to(t.device))
    return roots, gs


def leaves(model: torch.nn.Module, out_roots: list[torch.Tensor]) -> list[torch.Tensor]:
    """What the backward computes gradients for: every parameter that requires grad."""
    return [p for p in model.parameters() if p.requires_grad]


def rerun_backward(
    model: torch.nn.Module,
    forward: Callable[[], Any],
    grads: Grads,
    scale: float | None = None,
    find_op: bool = False,
) -> tuple[bool, OpEvent | None]:
    """Run ``forward()`` (the step's forward, from copies of its inputs, under its context) with
    grad on, then its backward from ``grads``. Returns (every gradient finite, first bad op event
    when ``find_op``)."""
    mode = FirstBadOp() if find_op else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # anomaly mode announces itself
        anomaly = torch.autograd.detect_anomaly(check_nan=False) if find_op else contextlib.nullcontext()
        with torch.enable_grad(), anomaly:
            out = forward()
            roots, gs = backward_roots(out, grads, scale)
            if not roots:
                return True, None
            params = leaves(model, roots)
            # on the calling thread: CUDA backward runs on the engine's device threads otherwise,
            # where the dispatch mode that names the op is not active (seen on the first GPU run)
            with (
                torch.autograd.set_multithreading_enabled(False),
                mode if mode is not None else contextlib.nullcontext(),
            ):
                res = torch.autograd.grad(roots, params, gs, allow_unused=True)
    finite = all(bool(torch.isfinite(g).all()) for g in res if g is not None)
    return finite, (mode.result if mode is not None else None)
