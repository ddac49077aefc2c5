"""``nanhunter diff`` held against an independent oracle (``tests/oracle/parting.py``: its own
dispatch tape, statistics, pairing and walk, sharing no code with nanhunter) over pairs of runs
that differ in one way (``tests/models/diff_pairs.py``): dtype change, one kernel changed,
flush-denormal, thread count, eager against compiled (each module compiled alone on eager's
inputs, the oracle's own way, against nanhunter's compiled trace). Per cell (pair × trace level) the verdicts
must agree: where the runs part beyond tolerance (module, op, or the region with no counterpart
and each side's ops), where they first differ bitwise, and whether the outputs differ.

The default slice runs every pair at one level (ops, or modules for the compiled pair, whose ops
the dispatch tape would run eagerly); the full product (both levels) is marked ``matrix_full`` and
runs with ``NANHUNTER_FULL_MATRIX=1``.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from clirun import invoke
from models import diff_pairs
from oracle import parting

from nan_hunter.trace.recorder import TraceRecorder

FULL = os.environ.get("NANHUNTER_FULL_MATRIX") == "1"
DEFAULT = {"dtype": "ops", "kernel": "ops", "flush_denormal": "ops", "threads": "ops", "compiled": "modules"}


def _cells():
    for pair in diff_pairs.PAIRS:
        for level in ("ops", "modules"):
            if pair == "compiled" and level == "ops":
                continue  # nanhunter refuses --trace-level ops with --compile; so would the tape
            if DEFAULT[pair] == level:
                yield pytest.param(pair, level, id=f"{pair}-{level}")
            else:
                yield pytest.param(
                    pair,
                    level,
                    id=f"{pair}-{level}",
                    marks=[
                        pytest.mark.matrix_full,
                        pytest.mark.skipif(not FULL, reason="full matrix: NANHUNTER_FULL_MATRIX=1"),
                    ],
                )


def _oracle_side(run: diff_pairs.Run, level: str) -> tuple[list, object]:
    tape: dict = {}

    @contextlib.contextmanager
    def rec(model):
        if run.compiled:  # a compiled region is opaque: the root call alone, from what it returned
            tape["model"] = model
            yield
            return
        t = parting.Tape(model, level)
        with t:
            yield
        tape["entries"] = t.entries

    out = diff_pairs.forward(run, rec)
    entries = tape.get("entries")
    if entries is None:  # compiled: each module compiled alone on eager's inputs, then the root's own call
        x = diff_pairs.inputs(run)
        entries = parting.compiled_alone(tape["model"]._orig_mod, x)
        entries.append(
            parting.Entry(
                len(entries),
                "",
                0,
                None,
                tuple(out.shape),
                out.dtype,
                parting.stat([out]),
                inp=parting.stat([x]),
            )
        )
    return entries, out


def _tool_side(run: diff_pairs.Run, level: str, path: Path) -> None:
    @contextlib.contextmanager
    def rec(model):
        kw = {"compile_backend": "inductor"} if run.compiled else {}
        with TraceRecorder(model, path, level=level, **kw) as r, r.input(0):
            yield

    diff_pairs.forward(run, rec)


def _as_parting(d: dict | None):
    if d is None:
        return None
    un = d.get("unmatched")
    return parting.Parting(d["module"], d["op"], (un["a"], un["b"]) if un else None)


@pytest.mark.parametrize("pair, level", list(_cells()))
def test_diff_agrees_with_the_oracle(tmp_path, pair, level):
    ra, rb = diff_pairs.PAIRS[pair]
    (ea, oa), (eb, ob) = _oracle_side(ra, level), _oracle_side(rb, level)
    truth = parting.part(ea, eb)
    truth.outputs = parting.outputs(oa, ob)
    pa, pb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _tool_side(ra, level, pa)
    _tool_side(rb, level, pb)
    js = tmp_path / "d.json"
    res = invoke("diff", pa, pb, "--json", js)
    assert res.code in (0, 1), res.stderr
    d = json.loads(js.read_text())
    got = (_as_parting(d["first_divergence"]), _as_parting(d["first_difference"]), d["outputs"]["equal"])
    assert got == (truth.divergence, truth.difference, truth.outputs), res.stdout
    assert res.code == (1 if truth.outputs == "differ" else 0)
