"""The configuration: ``configs/default.yaml`` (thresholds, fp8 emulation, bisect), then
``configs/ci.yaml`` (the ``check`` policy), then ``--config FILE`` deep-merged on top.

Loaded once into one frozen, typed ``Config`` that the stages take (``cfg.near_miss.max_listed``),
validated as it is built: unknown keys, wrong types, out-of-range numbers and unknown enum
values are refused with exit 2 and one line naming the file, the key and what was expected.
YAML aliases are refused (an alias bomb expands exponentially), and so are files that are not
regular files, larger than ``MAX_CONFIG_BYTES``, or not UTF-8.
"""

from __future__ import annotations

import functools
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .dtypes import FP8_COMPUTES, FP8_OVERFLOWS, FP8_SCALINGS, RUN_DTYPES, Fp8Recipe, UnknownDtype, canonical
from .errors import BadInput
from .options import Granularity

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few hundred bytes; refuse anything huge
GRANULARITIES = tuple(m.value for m in Granularity)  # "leaf", "block": bisect --granularity's choices


@dataclass(frozen=True)
class NearMissConfig:
    overflow_fraction: float
    absorbed_intermediates: bool
    max_listed: int


@dataclass(frozen=True)
class WeightsConfig:
    near_overflow_fraction: float
    targets: tuple[str, ...]
    max_rows: int


@dataclass(frozen=True)
class DiagnosisConfig:
    tiny_scale: float
    rel_err_warn: float
    param_fraction: float = 0.5  # a parameter past this fraction of the dtype's max does not fit it


@dataclass(frozen=True)
class Fp8Config:
    scaling: str
    amax_eps: float
    overflow: str
    compute: str

    def recipe(self, fmt: str = "fp8-e4m3") -> Fp8Recipe:
        return Fp8Recipe(fmt, self.scaling, self.amax_eps, self.overflow, self.compute)


@dataclass(frozen=True)
class BisectConfig:
    rtol: float
    granularity: str


@dataclass(frozen=True)
class ForecastConfig:
    window: int  # the latest sampled points a signal's growth is fitted over
    targets: tuple[str, ...]  # dtypes forecast besides the run's own (a planned switch)
    max_listed: int  # entries the terminal lists


@dataclass(frozen=True)
class PrecursorsConfig:
    """Thresholds of the precursor warnings (``forecast.precursors``); sources in the YAML."""

    window: int  # sampled points a rule's trend is fitted over
    attention_logit_min: float  # attention_logit_growth: max |q·k|/√d at least this
    attention_rise_db: float  # ... and risen at least this many dB over the window
    logz_min: float  # output_logit_divergence: max |log Z| at least this
    logz_rise: float  # ... and drifted up at least this much over the window
    z_loss: float  # the z-loss coefficient the fix names
    update_collapse_fraction: float  # update_collapse: share of elements with sqrt(v̂) < eps
    grad_spike_factor: float  # grad_norm_spike: this many times the recent median
    grad_spike_history: int  # ... of this many sampled steps before it


@dataclass(frozen=True)
class Thresholds:
    warn: float
    fail: float


@dataclass(frozen=True)
class HeadroomConfig:
    weights: dict[str, Thresholds]
    activations: dict[str, Thresholds]


@dataclass(frozen=True)
class CheckConfig:
    """The ``nanhunter check`` policy (top-level keys of ``configs/ci.yaml``)."""

    dtypes: tuple[str, ...]
    fail_on_nonfinite_weights: bool
    fail_on_nonfinite_forward: bool
    warn_on_absorbed: bool
    # check --baseline, rule headroom_regression: the floor in dB (20*log10(dtype max / absmax))
    # a tensor may not fall below; a fall that stays above it passes
    min_headroom_db: float
    headroom: HeadroomConfig


@dataclass(frozen=True)
class Config:
    near_miss: NearMissConfig
    weights: WeightsConfig
    diagnosis: DiagnosisConfig
    fp8: Fp8Config
    bisect: BisectConfig
    check: CheckConfig
    forecast: ForecastConfig
    precursors: PrecursorsConfig


# --- value checkers: each returns the typed value or raises ValueError("expected ...") ----------


def _number(v: Any, lo: float = 0.0, lo_open: bool = True, hi: float = math.inf) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"expected a number, got {type(v).__name__}")
    try:
        x = float(v)  # a YAML "1e-4" (no dot) is a string: accept it when it reads as a number
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"expected a finite number, got {v!r}")
    if x < lo or (lo_open and x == lo) or x > hi:
        raise ValueError(
            f"expected a number {'>' if lo_open else '>='} {lo:g}"
            + (f" and <= {hi:g}" if math.isfinite(hi) else "")
            + f", got {v!r}"
        )
    return x


def _positive(v: Any) -> float:
    return _number(v)


def _non_negative(v: Any) -> float:
    return _number(v, lo_open=False)


def _fraction(v: Any) -> float:
    return _number(v, hi=1.0)


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 1_000_000:
        raise ValueError(f"expected a whole number from 0 to 1000000, got {v!r}")
    return v


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def _choice(*options: str):
    def check(v: Any) -> str:
        if not isinstance(v, str) or v not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {v!r}")
        return v

    return check


def _dtype_name(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a dtype name ({', '.join(RUN_DTYPES)}), got {v!r}")
    try:
        d = canonical(v)
    except UnknownDtype as e:
        raise ValueError(str(e)) from None
    if d not in RUN_DTYPES:
        raise ValueError(f"expected one of {', '.join(RUN_DTYPES)}, got {v!r}")
    return d


def _dtype_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v:
        raise ValueError(f"expected a non-empty list of dtype names such as [fp16, bf16], got {v!r}")
    out: list[str] = []
    for x in v:
        d = _dtype_name(x)
        if d not in out:
            out.append(d)
    return tuple(out)


def _fp8_compute(v: Any) -> str:
    d = _dtype_name(v)
    if d not in FP8_COMPUTES:
        raise ValueError(f"expected one of {', '.join(FP8_COMPUTES)}, got {v!r}")
    return d


#: every key of the configuration: (section, key) → checker. A key missing here is refused.
SCHEMA: dict[str, dict[str, Any]] = {
    "near_miss": {"overflow_fraction": _fraction, "absorbed_intermediates": _flag, "max_listed": _count},
    "weights": {"near_overflow_fraction": _fraction, "targets": _dtype_list, "max_rows": _count},
    "diagnosis": {"tiny_scale": _positive, "rel_err_warn": _positive, "param_fraction": _fraction},
    "fp8": {
        "scaling": _choice(*FP8_SCALINGS),
        "amax_eps": _positive,
        "overflow": _choice(*FP8_OVERFLOWS),
        "compute": _fp8_compute,
    },
    "bisect": {"rtol": _positive, "granularity": _choice(*GRANULARITIES)},
    "forecast": {"window": _count, "targets": _dtype_list, "max_listed": _count},
    "precursors": {
        "window": _count,
        "attention_logit_min": _positive,
        "attention_rise_db": _positive,
        "logz_min": _positive,
        "logz_rise": _positive,
        "z_loss": _positive,
        "update_collapse_fraction": _fraction,
        "grad_spike_factor": _positive,
        "grad_spike_history": _count,
    },
}
CHECK_KEYS = {
    "dtypes": _dtype_list,
    "fail_on_nonfinite_weights": _flag,
    "fail_on_nonfinite_forward": _flag,
    "warn_on_absorbed": _flag,
    "min_headroom_db": _non_negative,
}
#: keys a past version read, with what replaced them: refused with the way to migrate
RETIRED_KEYS = {
    "max_headroom_drop_db": "headroom_regression no longer fails on a fall in dB that stays far "
    "inside the dtype's range; set min_headroom_db, the floor in dB a "
    "tensor's headroom may not fall below (default 20)"
}
_SECTIONS = {
    "near_miss": NearMissConfig,
    "weights": WeightsConfig,
    "diagnosis": DiagnosisConfig,
    "fp8": Fp8Config,
    "bisect": BisectConfig,
    "forecast": ForecastConfig,
    "precursors": PrecursorsConfig,
}


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read(path: Path, where: str) -> dict:
    """One YAML mapping from ``path``: a regular UTF-8 file, no aliases, bounded size and depth."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D401
            if self.check_event(yaml.AliasEvent):
                line = self.peek_event().start_mark.line + 1
                raise BadInput(
                    f"{where}: line {line}: YAML aliases (*name) are not allowed in a configuration; "
                    "write the value out"
                )
            return super().compose_node(parent, index)

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{where}: not a regular file; pass a YAML file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise BadInput(
                f"{where}: {st.st_size} bytes is too large for a configuration "
                f"(limit {MAX_CONFIG_BYTES}); pass a YAML file of thresholds"
            )
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise BadInput(f"{where}: cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadInput(f"{where}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    try:
        data = yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise BadInput(f"{where}: not valid YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise BadInput(f"{where}: nested too deeply to be a configuration") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInput(f"{where}: expected a mapping of sections at the top level, got {type(data).__name__}")
    return data


def _mapping(v: Any, where: str, key: str) -> dict:
    if not isinstance(v, dict):
        raise BadInput(f"{where}: {key} must be a mapping, got {type(v).__name__}")
    return v


def _build(data: dict, where: str) -> Config:
    known = set(SCHEMA) | set(CHECK_KEYS) | {"headroom"}
    for k in data:
        if k in RETIRED_KEYS:
            raise BadInput(f"{where}: {k} was replaced by min_headroom_db: {RETIRED_KEYS[k]}")
        if k not in known:
            raise BadInput(f"{where}: unknown key {k!r}; known keys: {', '.join(sorted(known, key=str))}")
    sections: dict[str, Any] = {}
    for sec, checkers in SCHEMA.items():
        body = _mapping(data.get(sec), where, sec)
        for k in body:
            if k not in checkers:
                raise BadInput(f"{where}: unknown key {sec}.{k}; known: {', '.join(checkers)}")
        values = {}
        for k, check in checkers.items():
            if k not in body:
                raise BadInput(f"{where}: {sec}.{k} is missing")
            try:
                values[k] = check(body[k])
            except ValueError as e:
                raise BadInput(f"{where}: {sec}.{k}: {e}") from None
        sections[sec] = _SECTIONS[sec](**values)
    check_values: dict[str, Any] = {}  # each key its own checker's type (CHECK_KEYS)
    for k, check in CHECK_KEYS.items():
        try:
            check_values[k] = check(data.get(k))
        except ValueError as e:
            raise BadInput(f"{where}: {k}: {e}") from None
    head = _mapping(data.get("headroom"), where, "headroom")
    parts: dict[str, dict[str, Thresholds]] = {}
    for part in ("weights", "activations"):
        for k in head:
            if k not in ("weights", "activations"):
                raise BadInput(f"{where}: unknown key headroom.{k}; known: weights, activations")
        table: dict[str, Thresholds] = {}
        for dt, th in _mapping(head.get(part) or {}, where, f"headroom.{part}").items():
            key = f"headroom.{part}.{dt}"
            try:
                name = _dtype_name(dt)
                body = th if isinstance(th, dict) else {}
                if set(body) != {"warn", "fail"}:
                    raise ValueError("expected {warn: NUMBER, fail: NUMBER}, e.g. {warn: 0.5, fail: 1.0}")
                t = Thresholds(_positive(body["warn"]), _positive(body["fail"]))
            except ValueError as e:
                raise BadInput(f"{where}: {key}: {e}") from None
            if t.warn > t.fail:
                raise BadInput(f"{where}: {key}: warn ({t.warn:g}) is above fail ({t.fail:g})")
            table[name] = t
        parts[part] = table
    return Config(**sections, check=CheckConfig(**check_values, headroom=HeadroomConfig(**parts)))


def load_config(path: str | os.PathLike | None = None) -> Config:
    """The configuration for one command: the shipped defaults, with ``path`` merged on top."""
    data = _merge(
        _read(CONFIG_DIR / "default.yaml", "configs/default.yaml"),
        _read(CONFIG_DIR / "ci.yaml", "configs/ci.yaml"),
    )
    where = "configs/default.yaml"
    if path:
        where = f"--config {path}"
        if not Path(path).exists():
            raise BadInput(f"{where}: file not found")
        data = _merge(data, _read(Path(path), where))
    return _build(data, where)


def as_config(config: str | os.PathLike | Config | None) -> Config:
    """A ``Config`` as given, or loaded from a ``--config`` path (None: the defaults)."""
    return config if isinstance(config, Config) else load_config(config)


@functools.cache
def default_config() -> Config:
    """The shipped defaults (no ``--config``), loaded once."""
    return load_config()


def config_keys() -> list[str]:
    """Dotted names of every leaf key (for the test that every key is read by some stage)."""
    keys = [f"{sec}.{k}" for sec, checkers in SCHEMA.items() for k in checkers]
    keys += list(CHECK_KEYS) + [f"headroom.{p}" for p in ("weights", "activations")]
    return keys
