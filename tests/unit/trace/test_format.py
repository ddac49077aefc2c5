"""trace/format.py: a trace is JSON lines — a header, one line per entry (statistics, JSON-safe:
a non-finite number is null), an end line that says the file was finished; ``.gz`` is gzip;
entries are numbered in order; a run that raised leaves no end line."""

from __future__ import annotations

import gzip
import json
import math

import pytest
import torch

from nan_hunter.trace.format import SCHEMA, Entry, Stats, TraceWriter, digest_stats, entry_line, number
from nan_hunter.trace.stats import digest


@pytest.mark.parametrize(
    "x, want", [(None, None), (1.5, 1.5), (math.inf, None), (-math.inf, None), (math.nan, None), (0.0, 0.0)]
)
def test_number(x, want):
    assert number(x) == want


@pytest.mark.parametrize(
    "counts, kind", [((0, 0, 0), None), ((1, 1, 1), "nan"), ((0, 2, 1), "posinf"), ((0, 0, 3), "neginf")]
)
def test_stats_kind_is_the_first_class_present(counts, kind):
    s = Stats(*counts, 1.0, 1.0, 0.0, 1.0, "h")
    assert s.kind == kind and s.classes == tuple(c > 0 for c in counts)
    assert s.to_dict() == {
        "nan": counts[0],
        "posinf": counts[1],
        "neginf": counts[2],
        "absmax": 1.0,
        "absmin": 1.0,
        "mean": 0.0,
        "l2": 1.0,
        "hash": "h",
    }


def test_entry_key():
    e = Entry(
        3,
        "m",
        "M",
        "aten.mm.default",
        1,
        2,
        4,
        "backward",
        None,
        None,
        (2,),
        "fp16",
        Stats(0, 0, 0, 1.0, 1.0, 0.0, 1.0, None),
        None,
    )
    assert e.key == ("m", 1, 2, 4, "backward")


def test_entry_line_from_a_digest():
    d = digest(torch.tensor([1.0, -4.0, float("inf")]))
    rec = entry_line(
        0,
        "m",
        "Linear",
        "aten.mm.default",
        0,
        0,
        0,
        "forward",
        ("model.py", 7),
        d,
        0.01,
        producers=[None],
        inputs=digest(torch.tensor([2.0])),
    )
    assert rec["source_file"] == "model.py" and rec["source_line"] == 7 and rec["shape"] == [3]
    assert (rec["posinf"], rec["absmax"], rec["dtype"], rec["spread"]) == (1, 4.0, "fp32", 0.01)
    assert rec["producers"] == [None] and rec["input"] == digest_stats(digest(torch.tensor([2.0])))
    json.dumps(rec, allow_nan=False)  # JSON-safe
    assert "producers" not in entry_line(0, "m", "M", None, 0, 0, 0, "forward", None, d, None)


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_header_entries_end(tmp_path, name):
    path = tmp_path / name
    w = TraceWriter(path)
    w.header("ops", {"threads": 1}, {"class": "Net"}, [{"index": 0}], None, note="x")
    d = digest(torch.ones(2))
    for i in range(3):
        w.entry(entry_line(i, "m", "M", "aten.add.Tensor", 0, 0, 0, "forward", None, d, None))
    w.close(unmeasured=0)
    w.close()  # twice: once
    raw = gzip.open(path).read() if name.endswith(".gz") else path.read_bytes()
    lines = [json.loads(line) for line in raw.decode().splitlines()]
    assert lines[0]["schema"] == SCHEMA and lines[0]["level"] == "ops" and lines[0]["note"] == "x"
    assert [line["index"] for line in lines[1:4]] == [0, 1, 2]
    assert lines[-1] == {"end": {"entries": 3, "unmeasured": 0}} and len(lines) == 5


def test_entries_must_come_in_order(tmp_path):
    w = TraceWriter(tmp_path / "t.jsonl")
    w.header("modules", {}, {}, [], None)
    with pytest.raises(ValueError, match="trace entry 1 written as entry 0"):
        w.entry({"index": 1})
    w.close()


def test_abandon_leaves_no_end_line(tmp_path):
    w = TraceWriter(tmp_path / "t.jsonl")
    w.header("modules", {}, {}, [], None)
    w.abandon()
    w.close()  # nothing more is written after abandon
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert len(lines) == 1 and "end" not in json.loads(lines[0])


def test_non_finite_numbers_cannot_reach_the_file(tmp_path):
    w = TraceWriter(tmp_path / "t.jsonl")
    with pytest.raises(ValueError):
        w.header("modules", {"x": math.nan}, {}, [], None)
    w.abandon()
