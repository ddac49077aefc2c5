"""What a sentinel's sampled steps record for the forecast and the precursor warnings.

On a sampled step (``Recorder``: every ``sample_every``-th) and only then, ``SampledSignals``
keeps, per step:

- ``absmax``: each hooked block's and the root's largest finite output magnitude, read from the
  recorder's own stats rows of that step (nothing measured twice);
- ``attention_logits``: per attention module (a module whose class name ends in ``Attention``,
  outermost only), the largest pre-softmax logit magnitude ``max |q·kᵀ·scale + bias|`` over the
  positions its mask keeps. The attention call is seen through a ``TorchFunctionMode`` entered
  around that module's forward: ``F.scaled_dot_product_attention`` (SDPA, whatever kernel it picks:
  math, flash, memory-efficient) is given its own ``q`` and ``k`` and the scores are recomputed
  eagerly in fp32 (``sdpa_logit_absmax``: GQA heads repeated, ``is_causal``, boolean and additive
  masks), and an eager attention's ``softmax`` input is read as is (``softmax_logit_absmax``);
- ``output_logsumexp``: ``max |log Z|`` over positions, ``log Z = logsumexp(logits, -1)`` of the
  model output's ``logits`` (a transformers ``ModelOutput``, or a dict with that key);
- with the optimizer: the gradients' global L2 norm (before ``optimizer.step()``) and, for an
  Adam-family optimizer (``exp_avg_sq`` state, ``eps`` and ``betas`` in its groups), the share of
  elements whose bias-corrected second-moment root is below ``eps`` — where ``eps`` rather than
  the gradient sets the update's size.

A step that is not sampled pays nothing: every hook here is registered when a sampled step starts
and removed when it ends (the optimizer's, once they fired).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..dtypes import name_of
from .compiled_regions import compiling
from .listener import Companion

ABSMAX, ATTENTION, LOGSUMEXP = "absmax", "attention_logits", "output_logsumexp"
SIGNALS = (ABSMAX, ATTENTION, LOGSUMEXP)
MAX_POINTS = 512  # per series: the oldest sampled points are dropped past this (bounded memory)
_CHUNK = 1 << 24  # score elements recomputed at once (64 MiB in fp32)


@dataclass
class AdamState:
    """One sampled optimizer step of an Adam-family optimizer."""

    step: int
    below_eps: float  # share of elements with sqrt(v̂) < eps
    eps: float
    median_root: float  # median over parameter tensors of the RMS of sqrt(v̂)


@dataclass
class Signals:
    """Everything the sampled steps recorded: ``series[(module, signal)] = [(step, value)]``."""

    series: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict)
    grad_norms: list[tuple[int, float]] = field(default_factory=list)
    adam: list[AdamState] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)  # the sampled steps, in order
    dtype: str | None = (
        None  # what the latest sampled forward computed in (its autocast dtype, else the weights')
    )

    def add(self, module: str, signal: str, step: int, value: float) -> None:
        if not math.isfinite(value):
            return  # a non-finite step is the fault's business, not a trend's
        pts = self.series.setdefault((module, signal), [])
        pts.append((step, value))
        if len(pts) > MAX_POINTS:
            del pts[0]


def sdpa_logit_absmax(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> float | None:
    """``max |q·kᵀ·scale + mask|`` over the positions ``scaled_dot_product_attention`` lets take part
    (a boolean mask's True entries, an additive mask's entries above half the dtype's lowest value,
    the lower triangle under ``is_causal``, aligned top-left as SDPA does), in fp32 chunks. Key heads
    fewer than query heads (GQA) are repeated. None when no position takes part."""
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    if q.dim() >= 3 and k.dim() >= 3 and k.shape[-3] != q.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf = q.detach().expand(*batch, L, E).reshape(-1, L, E)
    kf = k.detach().expand(*batch, S, E).reshape(-1, S, E)
    mask = attn_mask.detach().expand(*batch, L, S).reshape(-1, L, S) if attn_mask is not None else None
    causal = torch.ones(L, S, dtype=torch.bool, device=q.device).tril() if is_causal else None
    best: float | None = None
    step = max(1, _CHUNK // max(1, L * S))
    for i in range(0, qf.shape[0], step):
        s = torch.matmul(qf[i : i + step].to(work), kf[i : i + step].to(work).transpose(-1, -2)) * scale
        keep = causal
        if mask is not None:
            m = mask[i : i + step]
            if m.dtype == torch.bool:
                keep = m if keep is None else keep & m
            else:
                low = torch.finfo(m.dtype).min / 2
                ok = m > low
                s = s + torch.where(ok, m.to(work), 0.0)
                keep = ok if keep is None else keep & ok
        v = _kept_absmax(s, keep)
        if v is not None:
            best = v if best is None else max(best, v)
    return best


def softmax_logit_absmax(x: torch.Tensor) -> float | None:
    """An eager attention's softmax input: ``max |x|`` over its entries above half the dtype's lowest
    value (transformers fills masked positions with that lowest value, or -inf)."""
    x = x.detach()
    return _kept_absmax(
        x.to(torch.float32) if x.dtype != torch.float64 else x, x > torch.finfo(x.dtype).min / 2
    )


def _kept_absmax(s: torch.Tensor, keep: torch.Tensor | None) -> float | None:
    a = s.abs()
    a = torch.where(a.isfinite(), a, 0.0)  # a non-finite score is the fault's, not the trend's
    if keep is not None:
        if not bool(keep.any()):
            return None
        a = torch.where(keep, a, 0.0)
    return float(a.max()) if a.numel() else None


class _AttentionScores(TorchFunctionMode):
    """Entered around one attention module's forward: reads the scores of its SDPA or softmax call."""

    def __init__(self, seen: list[float]) -> None:
        super().__init__()
        self.seen = seen
        self.entered = False  # entered by the module's pre-hook (not inside a compiled region)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        try:
            scored = func in _SCORES  # every other op of the attention module passes straight through
        except TypeError:  # an unhashable callable: not one of them
            scored = False
        if scored:
            self._score(func, args, kwargs)
        return func(*args, **kwargs)

    def _score(self, func: Any, args: tuple, kwargs: dict) -> None:
        try:
            with torch.no_grad():
                if func is torch.nn.functional.scaled_dot_product_attention:
                    v = _sdpa_call(*args, **kwargs)
                elif args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
                    v = softmax_logit_absmax(args[0])
                else:
                    v = None
            if v is not None:
                self.seen.append(v)
        except (RuntimeError, TypeError, ValueError):  # an unusual call: no point, the step goes on
            pass


_SOFTMAX = (torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax)
_SCORES = frozenset((torch.nn.functional.scaled_dot_product_attention, *_SOFTMAX))  # what the mode reads


def _sdpa_call(
    query: torch.Tensor,
    key: torch.Tensor,
    value: Any = None,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    **_: Any,
) -> float | None:
    return sdpa_logit_absmax(query, key, attn_mask, is_causal, scale)


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost modules whose class name ends in ``Attention`` (LlamaAttention, GPT2Attention,
    nn.MultiheadAttention...), by name."""
    out: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if type(m).__name__.endswith("Attention") and not any(name.startswith(p + ".") for p, _ in out):
            out.append((name, m))
    return out


def logits_of(output: Any) -> torch.Tensor | None:
    """The output's ``logits`` (a ``ModelOutput`` attribute or a dict key), when floating."""
    t = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
    return t if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 1 and t.numel() else None


class SampledSignals(Companion):
    """Records ``Signals`` on the recorder's sampled steps (module docstring). The recorder calls
    ``sample_start`` when a sampled step's root forward starts and ``sample_end`` when it ends."""

    def __init__(self, model: nn.Module, optimizer: Any = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.signals = Signals()
        self._handles: list[Any] = []
        self._opt_handles: list[Any] = []
        self._attention = attention_modules(model)
        self._step = -1

    def attach(self) -> None:
        """A recorder companion: nothing is hooked until a sampled step starts."""

    @property
    def step_pending(self) -> bool:
        """The latest sampled step's optimizer step has not run yet (its gradient norm and optimizer
        state are read then)."""
        return bool(self._opt_handles)

    def sample_start(self, step: int) -> None:
        self._remove(self._opt_handles)
        self._step = step
        self.signals.steps.append(step)
        self.signals.dtype = self._compute_dtype()
        for name, m in self._attention:
            seen: list[float] = []
            mode = _AttentionScores(seen)
            self._handles.append(m.register_forward_pre_hook(self._enter(mode)))
            self._handles.append(m.register_forward_hook(self._exit(name, mode, seen), always_call=True))
        opt = self.optimizer
        if opt is not None and hasattr(opt, "register_step_pre_hook"):
            self._opt_handles = [
                opt.register_step_pre_hook(self._before_step),
                opt.register_step_post_hook(self._after_step),
            ]

    def _compute_dtype(self) -> str | None:
        p = next(iter(self.model.parameters()), None)
        if p is None:
            return None
        dev = p.device.type
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else p.dtype
        return name_of(dt)

    def sample_end(self, step: int, blocks: list[tuple[str, float]], output: Any) -> None:
        """The sampled step's forward ended: ``blocks`` are the recorder's (module, output absmax)."""
        self._remove(self._handles)
        for module, v in blocks:
            self.signals.add(module, ABSMAX, step, v)
        logits = logits_of(output)
        if logits is not None:
            with torch.no_grad():
                lz = torch.logsumexp(logits.detach().float(), dim=-1).abs()
                lz = torch.where(lz.isfinite(), lz, 0.0)
                self.signals.add("", LOGSUMEXP, step, float(lz.max()))

    def detach(self) -> None:
        self._remove(self._handles)
        self._remove(self._opt_handles)

    @staticmethod
    def _remove(handles: list[Any]) -> None:
        for h in handles:
            h.remove()
        handles.clear()

    def _enter(self, mode: _AttentionScores):
        def hook(module: nn.Module, args: tuple) -> None:
            if not compiling():
                mode.__enter__()
                mode.entered = True

        return hook

    def _exit(self, name: str, mode: _AttentionScores, seen: list[float]):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if mode.entered:
                mode.entered = False
                mode.__exit__(None, None, None)
            if seen:
                self.signals.add(name, ATTENTION, self._step, max(seen))
                seen.clear()

        return hook

    def _before_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        grads = [p.grad.detach() for g in opt.param_groups for p in g["params"] if p.grad is not None]
        if grads:
            with torch.no_grad():
                norms = torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
                self.signals.grad_norms.append((self._step, float(torch.linalg.vector_norm(norms))))

    def _after_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        self._remove(self._opt_handles)
        below = total = 0
        roots: list[float] = []
        eps_seen = None
        with torch.no_grad():
            for g in opt.param_groups:
                eps, betas = g.get("eps"), g.get("betas")
                if not isinstance(eps, (int, float)) or not isinstance(betas, (tuple, list)):
                    return
                for p in g["params"]:
                    st = opt.state.get(p) or {}
                    v, t = st.get("exp_avg_sq"), st.get("step")
                    if not isinstance(v, torch.Tensor) or t is None:
                        continue
                    t = float(t)
                    root = (v.float() / (1 - float(betas[1]) ** t)).sqrt()
                    below += int((root < eps).sum())
                    total += root.numel()
                    roots.append(float(root.square().mean().sqrt()))
                    eps_seen = float(eps)
        if total and eps_seen is not None:
            roots.sort()
            self.signals.adam.append(AdamState(self._step, below / total, eps_seen, roots[len(roots) // 2]))
