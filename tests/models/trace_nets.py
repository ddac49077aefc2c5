"""Small models for ``nanhunter diff``'s real uses (tests/integration/test_trace_diff.py).

- ``build`` / ``build_ftz``: a linear, a division by a stored subnormal scale (1e-39 in fp32),
  a linear. By default x / 1e-39 is ~1e36, finite; ``build_ftz`` turns flush-to-zero on
  (``torch.set_flush_denormal(True)``, as a training script's setup might) and the scale reads as
  0: x / 0 = ±inf. The first divergence is that division (module ``scale``, ``aten.div.Tensor``).
- ``build_cancel``: a linear, ``(x + 1024) - 1024``, a linear. In fp16, eager rounds ``x + 1024``
  to fp16 (spacing 1 at 1024), so the middle module returns x rounded to integers; inductor fuses
  the two adds in fp32 and returns x: compile changes the fp16 numbers.
"""

from __future__ import annotations

import torch
from torch import nn

DIM = 16


class DivScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(1e-39, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.scale


class Cancel(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1024.0) - 1024.0


class Net(nn.Module):
    def __init__(self, middle: nn.Module, gain: float = 1.0) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.mid = middle
        self.out = nn.Linear(DIM, 4)
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mid(self.inp(x) * self.gain))


def build() -> nn.Module:
    return Net(DivScale(), gain=1e-3)  # |x| / 1e-39 stays inside fp32's range


def build_ftz() -> nn.Module:
    torch.set_flush_denormal(True)
    return build()


def build_cancel() -> nn.Module:
    return Net(Cancel())


def save(tmp, factory=build, seed: int = 0) -> dict:
    """model.safetensors and inputs.safetensors for ``factory`` in ``tmp``."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    m = factory()
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(tmp / "model.safetensors"))
    save_file({"x": torch.randn(8, DIM) * 4}, str(tmp / "inputs.safetensors"))
    return {"ck": tmp / "model.safetensors", "inputs": tmp / "inputs.safetensors"}
