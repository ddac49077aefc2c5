"""Hand-made traces: the file format written directly, to test alignment and the first divergence
without running a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nan_hunter.trace.format import TraceWriter


def _crc(key: tuple) -> int:
    """A hash of the statistics that is the same in every process (``hash()`` of a str is not)."""
    import zlib

    return zlib.crc32(repr(key).encode())


ENV = {"versions": {"torch": "2.13.0"}, "device": "cpu", "threads": 2, "flush_denormal": False}


def entry(
    module: str,
    op: str | None = None,
    absmax: float = 1.0,
    mean: float = 0.0,
    l2: float = 1.0,
    nan: int = 0,
    posinf: int = 0,
    neginf: int = 0,
    producers: list | None = None,
    call_index: int = 0,
    shape: list | None = None,
    dtype: str = "fp32",
    spread: float | None = None,
    inp: dict | None = None,
    module_type: str = "M",
    step: int = 0,
    output: bool = False,
    input_dtypes: list | None = None,
    hash: str | None = None,
) -> dict[str, Any]:
    rec = {
        "index": None,
        "module": module,
        "module_type": module_type,
        "op": op,
        "call_index": call_index,
        "input_index": 0,
        "step": step,
        "phase": "forward",
        "source_file": "model.py",
        "source_line": 1,
        "shape": shape or [2, 2],
        "dtype": dtype,
        "nan": nan,
        "posinf": posinf,
        "neginf": neginf,
        "absmax": absmax,
        "absmin": 0.5 if absmax else None,
        "mean": mean,
        "l2": l2,
        "hash": hash or f"{_crc((module, op, absmax, mean, l2, nan, posinf, neginf, dtype)):08x}",
        "spread": spread,
    }
    if output:
        rec["output"] = True
    if input_dtypes is not None:
        rec["input_dtypes"] = input_dtypes
    if producers is not None:
        rec["producers"] = producers
    if inp is not None:
        rec["input"] = {"nan": 0, "posinf": 0, "neginf": 0, "absmin": None, "hash": "0", **inp}
    return rec


def write(
    path: Path,
    entries: list[dict],
    level: str = "ops",
    env: dict | None = None,
    modules: list[str] | None = None,
    inputs_hash: str = "abcd0123",
) -> Path:
    w = TraceWriter(path)
    names = modules if modules is not None else sorted({e["module"] for e in entries})
    w.header(
        level,
        env or ENV,
        {"class": "Net", "modules": names, "parameters": 10, "param_shapes_hash": "1"},
        [{"index": 0, "hash": inputs_hash}],
        None,
    )
    for i, e in enumerate(entries):
        w.entry({**e, "index": i})
    w.close()
    return path
