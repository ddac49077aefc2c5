"""load/bounded_json.py: JSON from untrusted files — the nesting depth measured before parsing (a
line of 100,000 ``[`` is a refusal, not a RecursionError), NaN/Infinity refused unless asked for, a
key given twice refused when asked, every problem one line naming where."""

from __future__ import annotations

import pytest

from nan_hunter.errors import BadInput
from nan_hunter.load.bounded_json import MAX_DEPTH, loads, nesting_depth


@pytest.mark.parametrize(
    "raw, limit, depth",
    [
        (b"1", 10, 0),
        (b"[]", 10, 1),
        (b'{"a": [1, {"b": []}]}', 10, 4),
        (b'{"a": "[[[[[["}', 10, 1),  # brackets inside strings do not count
        (b'{"a": "\\"[[[["}', 10, 1),  # nor after an escaped quote
        (b"[[[]]]", 2, None),
        (b"[" * 100_000 + b"]" * 100_000, MAX_DEPTH, None),
        (b"[[", 10, 2),  # unbalanced: a bound json can parse (it reports the syntax error)
    ],
)
def test_nesting_depth(raw, limit, depth):
    assert nesting_depth(raw, limit) == depth


@pytest.mark.parametrize(
    "raw, kw, value",
    [
        ('{"a": [1, 2]}', {}, {"a": [1, 2]}),
        (b'{"a": 1}', {}, {"a": 1}),
        ('{"a": NaN}', {"constants": True}, None),  # transformers' configs: NaN read as Python reads it
        ('{"a": 1, "a": 2}', {}, {"a": 2}),  # duplicates allowed unless asked
    ],
)
def test_loads(raw, kw, value):
    got = loads(raw, "f.json", **kw)
    if value is None:
        assert got["a"] != got["a"]
    else:
        assert got == value


@pytest.mark.parametrize(
    "raw, kw, says",
    [
        ("[" * 200 + "]" * 200, {}, "f.json: JSON nested deeper than 127 levels"),
        ("[[[]]]", {"max_depth": 2}, "f.json: JSON nested deeper than 2 levels"),
        ('{"a": NaN}', {}, "f.json: not valid JSON (NaN is not valid JSON)"),
        ('{"a": Infinity}', {}, "f.json: not valid JSON (Infinity is not valid JSON)"),
        ('{"a": 1, "a": 2}', {"unique_keys": True}, "f.json: not valid JSON (key 'a' is given twice)"),
        (b'{"a": "caf\xe9"}', {}, "f.json: not UTF-8 (invalid byte at offset 10)"),
        ("{oops", {}, "f.json: not valid JSON (Expecting property name enclosed in double quotes"),
    ],
)
def test_refusals_are_one_line(raw, kw, says):
    with pytest.raises(BadInput) as e:
        loads(raw, "f.json", **kw)
    assert str(e.value).startswith(says) and "\n" not in str(e.value)
