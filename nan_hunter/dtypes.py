"""The one dtype table: CLI names, torch dtypes and finite limits.

Torch is imported lazily so that the CLI can parse flags without it. Limits come from
``torch.finfo`` (never typed-in constants) and are cached after the first call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: Precisions a run can use (fp8 modes are emulated, see ``fp8.py``).
RUN_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2")
#: Precisions the replay matrix covers, in the order the report lists them.
REPLAY_DTYPES: tuple[str, ...] = RUN_DTYPES
#: Target dtypes whose headroom the weights scan and the stats kernel report.
HEADROOM_DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp8-e4m3", "fp8-e5m2")
#: Precisions bisect may keep modules in.
KEEP_DTYPES: tuple[str, ...] = ("fp32", "bf16")

_TORCH_NAMES = {
    "fp64": "float64",
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8-e4m3": "float8_e4m3fn",
    "fp8-e5m2": "float8_e5m2",
}
_ALIASES = {
    "float64": "fp64", "double": "fp64",
    "float32": "fp32", "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16", "half": "fp16",
    "e4m3": "fp8-e4m3", "float8_e4m3fn": "fp8-e4m3", "fp8": "fp8-e4m3",
    "e5m2": "fp8-e5m2", "float8_e5m2": "fp8-e5m2",
}


class UnknownDtype(ValueError):
    """A dtype name nanhunter does not know."""


def canonical(name: str) -> str:
    """Normalise a user-facing dtype name (``half``, ``float16``, ``fp16`` → ``fp16``)."""
    key = name.strip().lower().replace("_", "-") if name else ""
    key = _ALIASES.get(key, _ALIASES.get(key.replace("-", "_"), key))
    if key not in _TORCH_NAMES:
        raise UnknownDtype(
            f"unknown dtype {name!r}; use one of {', '.join(RUN_DTYPES)}"
        )
    return key


def is_fp8(name: str) -> bool:
    return canonical(name).startswith("fp8")


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, _TORCH_NAMES[canonical(name)])


def name_of(dtype: torch.dtype) -> str | None:
    """CLI name of a torch dtype, or None for non-float dtypes."""
    s = str(dtype).removeprefix("torch.")
    for k, v in _TORCH_NAMES.items():
        if v == s:
            return k
    return None


@dataclass(frozen=True)
class Limits:
    """Finite range of a floating dtype."""

    name: str
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float


@cache
def limits(name: str) -> Limits:
    import torch

    key = canonical(name)
    fi = torch.finfo(torch_dtype(key))
    # The smallest subnormal is 2**(min_exp - mantissa_bits); finfo exposes it as
    # smallest_normal * eps (eps = 2**-mantissa_bits).
    return Limits(key, float(fi.max), float(fi.smallest_normal), float(fi.smallest_normal * fi.eps),
                  float(fi.eps))


def max_of(name: str) -> float:
    return limits(name).max
