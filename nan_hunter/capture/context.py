"""The ambient state a root forward ran under, recorded by capture so a re-run can be made under the
same (``ForwardContext``: grad and inference mode, autocast, train/eval mode, the RNG), and the two
guards every re-run runs inside: the user's autocast switched off (``outside_users_autocast``) and
the user's RNG, buffers and train/eval modes restored after (``users_state_kept``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

_AMP_DEVICES = ("cpu", "cuda")


#: one call that says no autocast is on for any device (torch >= 2.0), so the per-device asks below
#: are made only when one is: a root call records its context on every forward
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)


def _autocast_now() -> tuple[tuple[str, torch.dtype], ...]:
    if _any_autocast is not None and not _any_autocast():
        return ()
    amp: tuple[tuple[str, torch.dtype], ...] = ()
    for dev in _AMP_DEVICES:
        try:
            if torch.is_autocast_enabled(dev):
                amp += ((dev, torch.get_autocast_dtype(dev)),)
        except (RuntimeError, TypeError):  # a device type this build does not know
            continue
    return amp


def _cuda_rng() -> torch.Tensor | None:
    try:
        return torch.cuda.get_rng_state()
    except RuntimeError:  # inside CUDA-graph capture
        return None


_generator = torch.default_generator


@dataclass(slots=True, eq=False)
class ForwardContext:
    """The ambient state a forward ran under, so a re-run can be made under the same: grad and
    inference mode, autocast, the root's train/eval mode and the RNG state (dropout masks).
    Recorded at every root call (``now``), read only by a re-run: never changed after."""

    grad: bool
    autocast: tuple[tuple[str, torch.dtype], ...]
    inference: bool = False
    training: bool | None = None
    rng: torch.Tensor | None = None
    cuda_rng: torch.Tensor | None = None

    @classmethod
    def now(cls, model: nn.Module | None = None) -> ForwardContext:
        """The state now, in one call (every watched root call takes it): the CPU RNG by the
        generator's own ``get_state`` (``torch.get_rng_state()``, one Python frame less); the CUDA
        RNG only once CUDA is initialised (none before, and none without CUDA)."""
        return cls(
            torch.is_grad_enabled(),
            _autocast_now() if _any_autocast is None or _any_autocast() else (),
            torch.is_inference_mode_enabled(),
            model.training if model is not None else None,
            _generator.get_state(),
            _cuda_rng() if torch.cuda.is_initialized() else None,
        )

    def enter(self, stack: contextlib.ExitStack) -> None:
        """Grad or inference mode and autocast as the forward had them."""
        if self.inference:
            stack.enter_context(torch.inference_mode())
        else:
            stack.enter_context(torch.set_grad_enabled(self.grad))
        for dev, dt in self.autocast:
            # no cast cache: a re-run made while the user's autocast block is still open (on_fault="raise")
            # would otherwise read the user's cached low-precision weight, and never run the cast itself
            stack.enter_context(torch.autocast(dev, dtype=dt, cache_enabled=False))

    def seed(self) -> None:
        """The RNG as the forward started (inside a forked RNG: the user's is restored after)."""
        if self.rng is not None:
            torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng)


@contextlib.contextmanager
def outside_users_autocast() -> Iterator[None]:
    """A report made while the user's ``torch.autocast`` is active (``on_fault="raise"`` raises from a
    hook inside the user's block; ``report()`` called inside it): autocast off and its weight cache
    unused, so that re-runs compute under the autocast their forward recorded (``ForwardContext``)
    and the replay's fp32 column is fp32. The user's flags come back on exit; nesting stays above
    zero throughout, so the user's cache is not cleared."""
    amp = _autocast_now()
    with contextlib.ExitStack() as stack:
        for dev, dt in amp:
            stack.enter_context(torch.autocast(dev, dtype=dt, enabled=False, cache_enabled=False))
        yield


@contextlib.contextmanager
def users_state_kept(model: nn.Module) -> Iterator[None]:
    """Whatever a re-run may change of the user's, restored after: the RNG (forked), buffers
    (BatchNorm running statistics in train mode) and every module's train/eval mode."""
    devices = (
        [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    )
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    modes = [(m, m.training) for m in model.modules()]
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        for m, mode in modes:
            m.training = mode
        for b, saved in buffers:
            if b.shape != saved.shape or not torch.equal(b, saved):
                ctx = torch.inference_mode() if b.is_inference() else torch.no_grad()
                with ctx:
                    b.copy_(saved)
