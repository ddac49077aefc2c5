"""JSON from untrusted files with bounded nesting: the depth is measured before parsing.

Python's ``json`` recurses once per nested array or object, so a line of 100,000 ``[`` ends in
``RecursionError`` (an internal error, exit 3) instead of a clear refusal. ``nesting_depth``
measures the depth first, in C-speed passes (strings removed, then innermost ``[]`` pairs
deleted level by level), and ``loads`` refuses past the bound with one line. NaN and Infinity,
which are not JSON, are refused too; ``unique_keys`` refuses an object key given twice.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import BadInput

#: Deepest nesting accepted by default: what serde_json (the safetensors reference parser) allows.
MAX_DEPTH = 127

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(raw: bytes, limit: int) -> int | None:
    """How deeply JSON text ``raw`` nests arrays and objects, if at most ``limit``; else None.

    Each pass deletes every innermost ``[]`` pair (objects count as brackets too), so the number
    of passes until nothing is left is the depth. Brackets that never balance are a syntax
    error: they are given back as a bound json can parse safely when it is small, else None.
    """
    if b"\\" in raw:  # escaped quotes possible: tokenize the strings
        outside = _STRING.sub(b"", raw)
    else:  # no escapes (the usual header): every other quote-delimited run is a string
        outside = b"".join(raw.split(b'"')[::2])
    s = outside.translate(_BRACKETS, _NOT_BRACKETS)
    del outside
    depth = 0
    while s:
        if depth >= limit:
            return None
        shorter = s.replace(b"[]", b"")
        if len(shorter) == len(s):  # unbalanced: json.loads reports the syntax error itself
            return depth + len(s) if depth + len(s) <= limit else None
        s, depth = shorter, depth + 1
    return depth


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"key {k!r} is given twice")
            seen.add(k)
    return d


def loads(
    raw: bytes | str,
    where: str,
    max_depth: int = MAX_DEPTH,
    unique_keys: bool = False,
    constants: bool = False,
) -> Any:
    """Parse JSON text; exit 2 with one line naming ``where`` when it is not valid or nests too deep.

    ``constants``: accept NaN and Infinity as Python's json (and transformers' configs) do.
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if nesting_depth(data, max_depth) is None:
        raise BadInput(f"{where}: JSON nested deeper than {max_depth} levels (or with unbalanced brackets)")
    try:
        text = raw if isinstance(raw, str) else raw.decode("utf-8")
        return json.loads(
            text,
            parse_constant=None if constants else _no_constant,
            object_pairs_hook=_unique if unique_keys else None,
        )
    except UnicodeDecodeError as e:
        raise BadInput(f"{where}: not UTF-8 (invalid byte at offset {e.start})") from None
    except RecursionError:  # not reachable after the depth check; kept so it can never be exit 3
        raise BadInput(f"{where}: JSON nested too deep") from None
    except ValueError as e:  # JSONDecodeError, the duplicate key, NaN, over-long integers
        raise BadInput(f"{where}: not valid JSON ({str(e).splitlines()[0]})") from None
