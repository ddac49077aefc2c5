"""Reading a ``nanhunter.trace/v1`` file back, as strictly as it was written.

Every way a file can be wrong is a ``BadInput`` with one line naming the file and what is wrong
(missing, a directory, not gzip or not text, not JSON, another schema, a line too long, a key
missing or of the wrong type, entries out of order, cut short before the end line): never a
traceback. Lines are read with a length bound, so a hostile file cannot make one huge line.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from dataclasses import dataclass
from typing import Any, Literal, overload

from ..errors import BadInput
from .format import LEVELS, PHASES, SCHEMA, Entry, Stats

MAX_HEADER = 32 << 20  # the header holds the model's module names
MAX_LINE = 1 << 20  # an entry line (producers of a cat of many tensors included)


@dataclass(frozen=True)
class Header:
    level: str
    repeat: int | None
    env: dict[str, Any]
    model: dict[str, Any]
    inputs: list[dict[str, Any]]
    raw: dict[str, Any]


@dataclass(frozen=True)
class Trace:
    path: str
    header: Header
    entries: list[Entry]


class _Bad(Exception):
    pass


@overload
def _int(v: Any, what: str, none: Literal[False] = False) -> int: ...


@overload
def _int(v: Any, what: str, none: bool) -> int | None: ...


def _int(v: Any, what: str, none: bool = False) -> int | None:
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Bad(f"{what} is {type(v).__name__}, not an integer")
    return v


def _float(v: Any, what: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _Bad(f"{what} is not a finite number")
    return float(v)


@overload
def _str(v: Any, what: str, none: Literal[False] = False, limit: int = 4096) -> str: ...


@overload
def _str(v: Any, what: str, none: bool, limit: int = 4096) -> str | None: ...


def _str(v: Any, what: str, none: bool = False, limit: int = 4096) -> str | None:
    if v is None and none:
        return None
    if not isinstance(v, str) or len(v) > limit:
        raise _Bad(f"{what} is not a string (of at most {limit} characters)")
    return v


def _stats(d: Any, what: str) -> Stats:
    if not isinstance(d, dict):
        raise _Bad(f"{what} is not an object")
    counts = [_int(d.get(k), f"{what}.{k}") for k in ("nan", "posinf", "neginf")]
    if any(c is not None and c < 0 for c in counts):
        raise _Bad(f"{what} has a negative count")
    return Stats(
        counts[0],
        counts[1],
        counts[2],
        _float(d.get("absmax"), f"{what}.absmax"),
        _float(d.get("absmin"), f"{what}.absmin"),
        _float(d.get("mean"), f"{what}.mean"),
        _float(d.get("l2"), f"{what}.l2"),
        _str(d.get("hash"), f"{what}.hash", none=True, limit=64),
    )


def _entry(d: Any, index: int) -> Entry:
    what = f"entry {index}"
    if not isinstance(d, dict):
        raise _Bad(f"{what} is not an object")
    missing = [
        k
        for k in (
            "index",
            "module",
            "module_type",
            "op",
            "call_index",
            "input_index",
            "step",
            "phase",
            "shape",
            "dtype",
            "nan",
            "posinf",
            "neginf",
            "absmax",
            "mean",
            "l2",
            "hash",
        )
        if k not in d
    ]
    if missing:
        raise _Bad(f"{what} has no {', '.join(missing)}")
    if _int(d["index"], f"{what}.index") != index:
        raise _Bad(f"entry {index} has index {d['index']} (entries must be numbered in order)")
    phase = _str(d["phase"], f"{what}.phase")
    if phase not in PHASES:
        raise _Bad(f"{what}.phase {phase!r} is not one of {', '.join(PHASES)}")
    shape = d["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) > 64
        or any(isinstance(s, bool) or not isinstance(s, int) for s in shape)
    ):
        raise _Bad(f"{what}.shape is not a list of integers")
    producers = d.get("producers")
    if producers is not None:
        if not isinstance(producers, list) or len(producers) > 100_000:
            raise _Bad(f"{what}.producers is not a list")
        for p in producers:
            if p is not None and (_int(p, f"{what}.producers[]") < 0 or p >= index):
                raise _Bad(f"{what}.producers names entry {p}, not an earlier one")
        producers = tuple(producers)
    inp = d.get("input")
    dtypes = d.get("input_dtypes")
    if dtypes is not None:
        if not isinstance(dtypes, list) or len(dtypes) > 64:
            raise _Bad(f"{what}.input_dtypes is not a list")
        dtypes = tuple(_str(x, f"{what}.input_dtypes[]", limit=64) for x in dtypes)
    output = d.get("output", False)
    if not isinstance(output, bool):
        raise _Bad(f"{what}.output is not true or false")
    return Entry(
        index,
        _str(d["module"], f"{what}.module"),
        _str(d["module_type"], f"{what}.module_type"),
        _str(d["op"], f"{what}.op", none=True),
        _int(d["call_index"], f"{what}.call_index"),
        _int(d["input_index"], f"{what}.input_index"),
        _int(d["step"], f"{what}.step"),
        phase,
        _str(d.get("source_file"), f"{what}.source_file", none=True),
        _int(d.get("source_line"), f"{what}.source_line", none=True),
        tuple(shape),
        _str(d["dtype"], f"{what}.dtype", none=True, limit=64),
        _stats(d, what),
        _float(d.get("spread"), f"{what}.spread"),
        producers,
        _stats(inp, f"{what}.input") if inp is not None else None,
        dtypes,
        output,
    )


def _header(d: Any) -> Header:
    if not isinstance(d, dict) or "schema" not in d:
        raise _Bad('its first line has no "schema": not a nanhunter trace')
    if d["schema"] != SCHEMA:
        raise _Bad(f"schema {str(d['schema'])[:80]!r}, expected {SCHEMA!r}")
    level = d.get("level")
    if level not in LEVELS:
        raise _Bad(f"level {str(level)[:40]!r} is not one of {', '.join(LEVELS)}")
    repeat = _int(d.get("repeat"), "repeat", none=True)
    env, model, inputs = d.get("env"), d.get("model"), d.get("inputs")
    if not isinstance(env, dict) or not isinstance(model, dict) or not isinstance(inputs, list):
        raise _Bad("the header's env, model or inputs is missing or of the wrong type")
    names = model.get("modules")
    if not isinstance(names, list) or any(not isinstance(n, str) for n in names):
        raise _Bad("the header's model.modules is not a list of names")
    if any(not isinstance(i, dict) or not isinstance(i.get("hash"), str) for i in inputs):
        raise _Bad("the header's inputs are not objects with a hash")
    return Header(level, repeat, env, model, inputs, d)


def _lines(f: Any, path: str):
    """(line number, parsed JSON) of every line, each read with a length bound."""
    n = 0
    while True:
        limit = MAX_HEADER if n == 0 else MAX_LINE
        line = f.readline(limit + 1)
        if not line:
            return
        n += 1
        if len(line) > limit:
            raise _Bad(f"line {n} is longer than {limit} bytes")
        if not line.endswith(b"\n"):
            raise _Bad("cut short inside its header" if n == 1 else f"cut short (line {n} has no end)")
        try:
            yield n, json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _Bad(f"line {n} is not JSON" + ("" if n > 1 else ": not a nanhunter trace")) from None
        except RecursionError:
            raise _Bad(f"line {n} nests too deeply") from None


def read_trace(path: str | os.PathLike) -> Trace:
    """The trace at ``path``, validated (``BadInput`` naming what is wrong)."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise BadInput(f"trace {p}: no such file")
    if os.path.isdir(p):
        raise BadInput(f"trace {p}: is a directory, not a trace file")
    try:
        with open(p, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        f = gzip.open(p, "rb") if gz else open(p, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise BadInput(f"trace {p}: cannot be read ({e.strerror or e})") from None
    header: Header | None = None
    entries: list[Entry] = []
    end: dict[str, Any] | None = None
    try:
        with f:
            for n, d in _lines(f, p):
                if end is not None:
                    raise _Bad(f"line {n} follows the end line")
                if header is None:
                    header = _header(d)
                elif isinstance(d, dict) and "end" in d:
                    end = d["end"] if isinstance(d["end"], dict) else {}
                else:
                    entries.append(_entry(d, len(entries)))
    except _Bad as e:
        raise BadInput(f"trace {p}: {e}") from None
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise BadInput(
            f"trace {p}: cannot be read ({'cut short' if isinstance(e, EOFError) else e})"
        ) from None
    if header is None:
        raise BadInput(f"trace {p}: empty file, not a nanhunter trace")
    if end is None:
        raise BadInput(
            f"trace {p}: cut short after {len(entries)} entries (no end line): the run that wrote it "
            "did not finish"
        )
    if end.get("entries") != len(entries):
        raise BadInput(
            f"trace {p}: the end line counts {str(end.get('entries'))[:20]} entries, the file holds "
            f"{len(entries)}"
        )
    return Trace(p, header, entries)
