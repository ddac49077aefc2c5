"""The one dtype table and the one dtype rule.

The table: CLI names, torch dtypes and finite limits. Limits follow from each format's bit layout
(exponent and mantissa widths, and whether the all-ones exponent is Inf/NaN or, for e4m3fn, still
finite): never typed-in constants, equal to ``torch.finfo`` (tests/unit/test_dtypes.py holds them
against it), and known without importing torch, so a weights-only scan never loads it.

The rule: a run's precision is one ``RunDtype``, built once from the CLI's or the API's dtype
(``RunDtype.of``). It says which dtype parameters and activations are stored and computed in
(``compute``), which dtype bounds their range (``range`` — what near misses, headroom and the
overflow rules measure against) and how fp8 is emulated (``fp8``). fp8 runs store and compute
in ``fp8.compute`` (bf16 by default) and quantise only matmul operands, scaled by their amax, so
the fp8 max bounds those scaled operands, never an activation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, overload

from .errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: Precisions a run can use (fp8 modes are emulated, see ``model/fp8.py``).
RUN_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2")
#: Precisions the replay matrix covers, in the order the report lists them.
REPLAY_DTYPES: tuple[str, ...] = RUN_DTYPES
#: Target dtypes whose headroom the weights scan and the stats kernel report.
HEADROOM_DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp8-e4m3", "fp8-e5m2")

_TORCH_NAMES = {
    "fp64": "float64",
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8-e4m3": "float8_e4m3fn",
    "fp8-e5m2": "float8_e5m2",
}
_ALIASES = {
    "float64": "fp64",
    "double": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "e4m3": "fp8-e4m3",
    "float8_e4m3fn": "fp8-e4m3",
    "fp8": "fp8-e4m3",
    "e5m2": "fp8-e5m2",
    "float8_e5m2": "fp8-e5m2",
}


class UnknownDtype(ValueError):
    """A dtype name nanhunter does not know."""


def canonical(name: str) -> str:
    """Normalise a user-facing dtype name (``half``, ``float16``, ``fp16`` → ``fp16``)."""
    key = name.strip().lower().replace("_", "-") if name else ""
    key = _ALIASES.get(key, _ALIASES.get(key.replace("-", "_"), key))
    if key not in _TORCH_NAMES:
        raise UnknownDtype(f"unknown dtype {name!r}; use one of {', '.join(RUN_DTYPES)}")
    return key


def is_fp8(name: str) -> bool:
    return canonical(name).startswith("fp8")


def torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, _TORCH_NAMES[canonical(name)])
    return dtype


def name_of(dtype: torch.dtype | str) -> str | None:
    """CLI name of a torch dtype (or of its ``str()``, with or without ``torch.``), or None for non-float dtypes."""
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

    @property
    def flush(self) -> float:
        """The largest |x| a cast to this dtype rounds to zero: half the smallest subnormal (round
        to nearest even: exactly half ties to the even zero)."""
        return self.smallest_subnormal / 2


#: canonical name → (exponent bits, mantissa bits, all-ones exponent is finite): e4m3fn spends only
#: S.1111.111 on NaN and has no Inf, so its top exponent holds finite values; the others are IEEE-like.
_LAYOUTS: dict[str, tuple[int, int, bool]] = {
    "fp64": (11, 52, False),
    "fp32": (8, 23, False),
    "bf16": (8, 7, False),
    "fp16": (5, 10, False),
    "fp8-e4m3": (4, 3, True),
    "fp8-e5m2": (5, 2, False),
}


@cache
def limits(name: str) -> Limits:
    key = canonical(name)
    exp_bits, man_bits, top_finite = _LAYOUTS[key]
    bias = (1 << (exp_bits - 1)) - 1
    if top_finite:  # the all-ones exponent is a normal binade whose all-ones mantissa is NaN
        mx = (2.0 - 2.0 ** (1 - man_bits)) * 2.0 ** ((1 << exp_bits) - 1 - bias)
    else:  # the all-ones exponent is Inf/NaN: the largest finite value has the one below it
        mx = (2.0 - 2.0**-man_bits) * 2.0 ** ((1 << exp_bits) - 2 - bias)
    normal = 2.0 ** (1 - bias)
    return Limits(key, mx, normal, normal * 2.0**-man_bits, 2.0**-man_bits)


#: fp8 emulation choices (see ``model/fp8.py`` for the numerics).
FP8_SCALINGS: tuple[str, ...] = ("tensorwise", "rowwise", "none")
FP8_OVERFLOWS: tuple[str, ...] = ("saturate", "nonfinite")
FP8_COMPUTES: tuple[str, ...] = ("bf16", "fp32")


@dataclass(frozen=True)
class Fp8Recipe:
    """How fp8 is emulated: the format, amax scaling, overflow policy and the dtype of
    everything that is not an emulated fp8 operand."""

    fmt: str = "fp8-e4m3"
    scaling: str = "tensorwise"
    amax_eps: float = 1e-12
    overflow: str = "saturate"
    compute: str = "bf16"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", canonical(self.fmt))
        if not self.fmt.startswith("fp8"):
            raise ValueError(f"fp8 format must be fp8-e4m3 or fp8-e5m2, got {self.fmt}")
        if self.scaling not in FP8_SCALINGS:
            raise ValueError(f"fp8 scaling must be one of {', '.join(FP8_SCALINGS)}, got {self.scaling!r}")
        if self.overflow not in FP8_OVERFLOWS:
            raise ValueError(f"fp8 overflow must be one of {', '.join(FP8_OVERFLOWS)}, got {self.overflow!r}")
        if canonical(self.compute) not in FP8_COMPUTES:
            raise ValueError(f"fp8 compute must be one of {', '.join(FP8_COMPUTES)}, got {self.compute!r}")
        object.__setattr__(self, "compute", canonical(self.compute))
        if not (isinstance(self.amax_eps, (int, float)) and self.amax_eps > 0):
            raise ValueError("fp8 amax_eps must be a number > 0")


@dataclass(frozen=True)
class RunDtype:
    """The precision of one run (the one dtype rule; see the module docstring). ``recipe`` is the
    configured fp8 emulation; it applies when ``name`` is an fp8 dtype and is carried along
    otherwise, so that the replay matrix's fp8 columns use it too."""

    name: str
    recipe: Fp8Recipe = Fp8Recipe()

    @classmethod
    def of(cls, name: str, recipe: Fp8Recipe | None = None) -> RunDtype:
        """``name`` (any alias) as a run dtype; the recipe's format is set to ``name`` for fp8."""
        key = canonical(name)
        if key not in RUN_DTYPES:
            raise UnknownDtype(f"dtype {name!r} cannot be run; use one of {', '.join(RUN_DTYPES)}")
        base = recipe or Fp8Recipe()
        fmt = key if key.startswith("fp8") else base.fmt
        return cls(key, Fp8Recipe(fmt, base.scaling, base.amax_eps, base.overflow, base.compute))

    def with_name(self, name: str) -> RunDtype:
        """The same recipe at another precision (the replay matrix re-runs one region in each)."""
        return RunDtype.of(name, self.recipe)

    @property
    def fp8(self) -> Fp8Recipe | None:
        """The fp8 emulation of this run, or None when it is not an fp8 run."""
        return self.recipe if self.name.startswith("fp8") else None

    @property
    def is_fp8(self) -> bool:
        return self.fp8 is not None

    @property
    def compute(self) -> str:
        """Name of the dtype parameters, buffers and activations are cast to and computed in."""
        return self.fp8.compute if self.fp8 is not None else self.name

    @property
    def torch_compute(self) -> torch.dtype:
        return torch_dtype(self.compute)

    @property
    def range(self) -> Limits:
        """Limits of what activations are stored in: near misses and headroom measure against it."""
        return limits(self.compute)

    def __str__(self) -> str:
        return self.name


def step_precision(
    run: RunDtype | None,
    autocast: Sequence[tuple[str, torch.dtype]] = (),
    device_type: str | None = None,
    param_dtype: torch.dtype | None = None,
) -> RunDtype | None:
    """The one answer to "which precision did this step compute in": the run's own (a watch's or
    a capsule's dtype), else the autocast dtype of ``device_type`` (else the first autocast),
    else the parameters' dtype; None when none of them names a run dtype."""
    if run is not None:
        return run
    if autocast:
        dt = next((d for dev, d in autocast if dev == device_type), autocast[0][1])
        name = name_of(dt)
        if name:
            return RunDtype.of(name)
    name = name_of(param_dtype) if param_dtype is not None else None
    return RunDtype.of(name) if name else None


def autocast_of(
    autocast: Sequence[tuple[str, torch.dtype | str]], device_type: str | None = None
) -> dict[str, str] | None:
    """The report's ``run.autocast``: ``{device_type, dtype}`` of the autocast the ops of
    ``device_type`` ran under (else the first active one), None when none was active."""
    if not autocast:
        return None
    dev, dt = next(((d, t) for d, t in autocast if d == device_type), autocast[0])
    name = name_of(dt) or canonical(str(dt))  # a torch dtype, or a name (a capsule's)
    return {"device_type": dev, "dtype": name}


@overload
def parse_dtype(dtype: str, flag: str = "--dtype") -> str: ...


@overload
def parse_dtype(dtype: str | None, flag: str = "--dtype") -> str | None: ...


def parse_dtype(dtype: str | None, flag: str = "--dtype") -> str | None:
    """A user's dtype name → its canonical run dtype name; exit 2 (BadInput) for anything else."""
    if dtype is None:
        return None
    try:
        d = canonical(dtype)
    except UnknownDtype as e:
        raise BadInput(f"{flag}: {e}") from None
    if d not in RUN_DTYPES:
        raise BadInput(f"{flag}: {dtype!r} cannot be run; use one of {', '.join(RUN_DTYPES)}")
    return d
