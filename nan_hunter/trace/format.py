"""The ``nanhunter.trace/v1`` file: JSON lines (gzip when the name ends in ``.gz``), no pickle.

Line 1 is the header (``schema``, ``level``, ``repeat``, ``env``, ``model``, ``inputs``); then one
line per entry, in execution order, each with ``index`` = its line number minus 2; the last line
is ``{"end": {"entries": N}}``, so a file cut short is told from a complete one. The full
description is docs/trace-format.md; this module writes it (``TraceWriter``, streaming: nothing
is kept once written) and its typed form (``Entry``, ``Stats``) is what ``reader`` returns.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
from dataclasses import dataclass
from typing import Any

from ..options import TraceLevel

SCHEMA = "nanhunter.trace/v1"
LEVELS = tuple(m.value for m in TraceLevel)  # "modules", "ops": the one list is nan_hunter.options.TraceLevel
PHASES = ("forward", "backward", "optimizer")
#: the keys of an entry line, in the order they are written (op level adds ``producers`` and, on the
#: entries that made the root call's outputs, ``output: true``; module level adds ``input``: the
#: same statistics over the call's floating inputs; both add ``input_dtypes``)
ENTRY_KEYS = (
    "index",
    "module",
    "module_type",
    "op",
    "call_index",
    "input_index",
    "step",
    "phase",
    "source_file",
    "source_line",
    "shape",
    "dtype",
    "nan",
    "posinf",
    "neginf",
    "absmax",
    "absmin",
    "mean",
    "l2",
    "hash",
    "spread",
)
STAT_KEYS = ("nan", "posinf", "neginf", "absmax", "absmin", "mean", "l2", "hash")


def number(x: float | None) -> float | None:
    """A float fit for JSON: None for None and for a non-finite value (statistics are over finite
    values, so this only guards against an overflowing sum)."""
    return x if x is None or math.isfinite(x) else None


@dataclass(frozen=True)
class Stats:
    """The statistics of an entry's outputs (or, under ``Entry.input``, of its inputs)."""

    nan: int
    posinf: int
    neginf: int
    absmax: float | None
    absmin: float | None
    mean: float | None
    l2: float | None
    hash: str | None

    @property
    def kind(self) -> str | None:
        """The first non-finite class present: nan, else posinf, else neginf, else None."""
        return "nan" if self.nan else "posinf" if self.posinf else "neginf" if self.neginf else None

    @property
    def classes(self) -> tuple[bool, bool, bool]:
        return self.nan > 0, self.posinf > 0, self.neginf > 0

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in STAT_KEYS}


@dataclass(frozen=True)
class Entry:
    """One module call (level modules) or one aten op (level ops) of a trace."""

    index: int
    module: str
    module_type: str
    op: str | None
    call_index: int
    input_index: int
    step: int
    phase: str
    source_file: str | None
    source_line: int | None
    shape: tuple[int, ...]
    dtype: str | None
    stats: Stats
    spread: float | None
    producers: tuple[int | None, ...] | None = None  # op level: the entry that produced each input
    input: Stats | None = None  # module level: the statistics of the call's floating inputs
    input_dtypes: tuple[str, ...] | None = None  # the dtypes of the floating inputs (None: not recorded)
    output: bool = False  # op level: this entry made (part of) the root call's output

    @property
    def key(self) -> tuple[str, int, int, int, str]:
        """Where the call sits: the same in every run of the same model and inputs."""
        return self.module, self.call_index, self.input_index, self.step, self.phase


def entry_line(
    index: int,
    module: str,
    module_type: str,
    op: str | None,
    call_index: int,
    input_index: int,
    step: int,
    phase: str,
    source: tuple[str, int] | None,
    d: Any,
    spread: float | None,
    producers: list[int | None] | None = None,
    inputs: Any = None,
    input_dtypes: list[str] | None = None,
) -> dict[str, Any]:
    """The JSON object of one entry from a ``stats.Digest`` ``d`` (and ``inputs``, a digest or None;
    ``input_dtypes``: the dtypes of the floating inputs, None when not recorded)."""
    rec: dict[str, Any] = {
        "index": index,
        "module": module,
        "module_type": module_type,
        "op": op,
        "call_index": call_index,
        "input_index": input_index,
        "step": step,
        "phase": phase,
        "source_file": source[0] if source else None,
        "source_line": source[1] if source else None,
        "shape": list(d.shape),
        "dtype": d.dtype,
        **digest_stats(d),
        "spread": number(spread),
    }
    if producers is not None:
        rec["producers"] = producers
    if inputs is not None:
        rec["input"] = digest_stats(inputs)
    if input_dtypes is not None:
        rec["input_dtypes"] = list(input_dtypes)
    return rec


def digest_stats(d: Any) -> dict[str, Any]:
    """The statistics keys of an entry from a ``stats.Digest``."""
    return {
        "nan": d.nan,
        "posinf": d.posinf,
        "neginf": d.neginf,
        "absmax": number(d.absmax),
        "absmin": number(d.absmin),
        "mean": number(d.mean),
        "l2": number(d.l2),
        "hash": d.hash,
    }


class TraceWriter:
    """Streams a trace to ``path``: ``header`` once, ``entry`` per entry, ``close`` writes the end
    line. Lines are buffered by the file object; nothing is kept in memory once written."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        raw: io.BufferedIOBase
        if self.path.endswith(".gz"):
            raw = gzip.open(self.path, "wb", compresslevel=6)
        else:
            raw = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._f = io.TextIOWrapper(raw, encoding="utf-8", newline="\n", write_through=False)
        self.entries = 0
        self.closed = False
        self._dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=True).encode

    def header(
        self,
        level: str,
        env: dict[str, Any],
        model: dict[str, Any],
        inputs: list[dict[str, Any]],
        repeat: int | None,
        **extra: Any,
    ) -> None:
        head = {
            "schema": SCHEMA,
            "level": level,
            "repeat": repeat,
            "env": env,
            "model": model,
            "inputs": inputs,
            **extra,
        }
        self._f.write(self._dumps(head) + "\n")

    def entry(self, rec: dict[str, Any]) -> None:
        if rec["index"] != self.entries:
            raise ValueError(f"trace entry {rec['index']} written as entry {self.entries}")
        self._f.write(self._dumps(rec) + "\n")
        self.entries += 1

    def close(self, **extra: Any) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._f.write(self._dumps({"end": {"entries": self.entries, **extra}}) + "\n")
        finally:
            self._f.close()

    def abandon(self) -> None:
        """Close without the end line (a run that raised: the file reads as cut short)."""
        if not self.closed:
            self.closed = True
            self._f.close()
