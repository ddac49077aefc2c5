"""Reading a trace back: every way a file can be wrong is one line of BadInput, never a traceback."""

from __future__ import annotations

import gzip
import json

import pytest

from nan_hunter.errors import BadInput
from nan_hunter.trace.reader import read_trace

from ..divergence.synthetic import entry, write


def _good(tmp_path, name="t.jsonl"):
    return write(
        tmp_path / name,
        [entry("a", "aten.mm.default", producers=[None]), entry("a", "aten.relu.default", producers=[0])],
    )


def test_round_trip(tmp_path):
    t = read_trace(_good(tmp_path))
    assert t.header.level == "ops" and len(t.entries) == 2
    e = t.entries[1]
    assert (e.module, e.op, e.producers, e.stats.absmax, e.key) == (
        "a",
        "aten.relu.default",
        (0,),
        1.0,
        ("a", 0, 0, 0, "forward"),
    )


def test_gzip_by_content(tmp_path):
    raw = _good(tmp_path).read_bytes()
    gz = tmp_path / "t.trace"  # no .gz suffix: recognised by its magic bytes
    gz.write_bytes(gzip.compress(raw))
    assert len(read_trace(gz).entries) == 2


def _lines(tmp_path):
    return _good(tmp_path).read_text().splitlines(keepends=True)


@pytest.mark.parametrize(
    "name, make, words",
    [
        ("missing", lambda p: p / "nope.jsonl", "no such file"),
        ("directory", lambda p: p, "is a directory"),
        ("empty", lambda p: _w(p, ""), "empty file"),
        ("not JSON", lambda p: _w(p, "# a README\n"), "not a nanhunter trace"),
        ("JSON but no schema", lambda p: _w(p, '{"a": 1}\n'), "not a nanhunter trace"),
        (
            "another schema",
            lambda p: _w(p, '{"schema": "nanhunter.report/v1"}\n'),
            "expected 'nanhunter.trace/v1'",
        ),
        ("cut before the end line", lambda p: _w(p, "".join(_lines(p)[:-1])), "cut short after 2 entries"),
        ("cut inside a line", lambda p: _w(p, "".join(_lines(p))[:-30]), "cut short"),
        ("cut inside the header", lambda p: _w(p, _lines(p)[0][:50]), "cut short inside its header"),
        ("entry of the wrong type", lambda p: _w(p, _lines(p)[0] + '{"index": 0, "module": 3}\n'), "entry 0"),
        (
            "entries out of order",
            lambda p: _w(p, _lines(p)[0] + _lines(p)[2] + _lines(p)[1] + _lines(p)[3]),
            "numbered in order",
        ),
        (
            "producer after the entry",
            lambda p: _w(
                p,
                _lines(p)[0]
                + _lines(p)[1].replace('"producers":[null]', '"producers":[5]')
                + _lines(p)[2]
                + _lines(p)[3],
            ),
            "not an earlier one",
        ),
        (
            "wrong end count",
            lambda p: _w(p, "".join(_lines(p)[:-1]) + '{"end": {"entries": 7}}\n'),
            "counts 7",
        ),
        (
            "truncated gzip",
            lambda p: _wb(p, gzip.compress("".join(_lines(p)).encode())[:-20]),
            "cannot be read",
        ),
        ("binary", lambda p: _wb(p, bytes(range(256)) * 4), "not"),
        (
            "nan in a number",
            lambda p: _w(
                p,
                _lines(p)[0] + _lines(p)[1].replace('"absmax":1.0', '"absmax":NaN') + "".join(_lines(p)[2:]),
            ),
            "not a finite number",
        ),
    ],
)
def test_bad_trace_is_one_line(tmp_path, name, make, words):
    path = make(tmp_path)
    with pytest.raises(BadInput) as e:
        read_trace(path)
    msg = str(e.value)
    assert words in msg and "\n" not in msg, msg


def _w(p, text):
    f = p / "bad.jsonl"
    f.write_text(text)
    return f


def _wb(p, data):
    f = p / "bad.bin"
    f.write_bytes(data)
    return f


def test_header_keeps_unknown_keys_for_later_versions(tmp_path):
    lines = _lines(tmp_path)
    head = json.loads(lines[0])
    head["future_key"] = 1
    p = _w(tmp_path, json.dumps(head) + "\n" + "".join(lines[1:]))
    assert read_trace(p).header.raw["future_key"] == 1


def test_input_dtypes_and_output_are_read_and_checked(tmp_path):
    good = write(
        tmp_path / "g.jsonl",
        [entry("m", "aten.mm.default", producers=[None], input_dtypes=["bf16"], output=True)],
    )
    e = read_trace(good).entries[0]
    assert e.input_dtypes == ("bf16",) and e.output is True
    for bad, words in (
        ({"input_dtypes": "bf16"}, "input_dtypes is not a list"),
        ({"output": 1}, "output is not"),
    ):
        p = write(tmp_path / "b.jsonl", [{**entry("m", "aten.mm.default", producers=[None]), **bad}])
        with pytest.raises(BadInput, match=words):
            read_trace(p)
