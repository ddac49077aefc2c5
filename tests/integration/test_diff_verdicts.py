"""``nanhunter diff`` names where two runs really part (issue 48, item 3; contract v1.4), through the
real command on traces of real runs (tests/models/diff_pairs.py), each a verdict nanhunter 1.3
got wrong:

- fp16 against bf16 of the same Llama: 1.3 blamed ``input_layernorm · aten._to_copy``, the exact
  fp32 upcast of an embedding that already differed, judged at fp32's tolerance. Now every entry
  is judged in the precision it was computed in, an exact op is never blamed: no divergence, the
  outputs within tolerance, exit 0.
- two bf16 runs where one Linear's kernel changed (``addmm`` against ``mm, mm, add, add``): 1.3
  skipped the Linear's ops and blamed the next RMSNorm's cast; its modules level said "no
  divergence". Now both levels name the Linear as where the runs first differ (at op level as
  the region with no counterpart), and the outputs are within tolerance (exit 0).
- the default against ``torch.set_flush_denormal(True)`` with bitwise-equal outputs: 1.3 exited 1
  with ``max_rel_err`` 3.4e18 (4e-20 against 0 over the smallest normal). Now the subnormal
  against 0 agrees, the op that scaled it up is where the runs part, the outputs are bitwise
  equal: exit 0, and exit 1 with ``--fail-on divergence``.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from clirun import invoke
from models import diff_pairs

from nan_hunter.trace.recorder import TraceRecorder


def record(path: Path, level: str):
    @contextlib.contextmanager
    def rec(model):
        with TraceRecorder(model, path, level=level) as r, r.input(0):
            yield

    return rec


def traces(tmp: Path, pair: str, level: str) -> tuple[Path, Path]:
    a, b = diff_pairs.PAIRS[pair]
    pa, pb = tmp / f"{pair}-a-{level}.jsonl", tmp / f"{pair}-b-{level}.jsonl"
    diff_pairs.forward(a, record(pa, level))
    diff_pairs.forward(b, record(pb, level))
    return pa, pb


def diff(a: Path, b: Path, *extra: str):
    js = a.with_suffix(".diff.json")
    res = invoke("diff", a, b, "--json", js, *extra, env={"COLUMNS": "80"})
    return res, json.loads(js.read_text()) if js.exists() else None


@pytest.mark.parametrize("level", ["ops", "modules"])
def test_fp16_against_bf16_blames_no_exact_cast(tmp_path, level):
    res, d = diff(*traces(tmp_path, "dtype", level))
    assert res.code == 0, res.stdout + res.stderr
    assert d["first_divergence"] is None, d["first_divergence"]
    assert d["outputs"]["equal"] == "within_tolerance" and d["outputs"]["tolerance"] == 1e-2
    lines = res.stdout.splitlines()
    assert lines[0].startswith("✔") and lines[1].startswith("  outputs within tolerance")


def test_a_changed_kernel_is_named_at_both_levels(tmp_path):
    for level in ("ops", "modules"):
        res, d = diff(*traces(tmp_path, "kernel", level))
        assert res.code == 0, res.stdout + res.stderr
        assert d["outputs"]["equal"] == "within_tolerance"
        fd = d["first_difference"]
        assert (fd["module"], fd["module_type"], fd["inputs_agree"]) == (diff_pairs.SPLIT, "Linear", True)
        if level == "ops":
            assert fd["op"] is None and fd["unmatched"] == {
                "a": ["aten.mm.default", "aten.mm.default", "aten.add.Tensor", "aten.add.Tensor"],
                "b": ["aten.addmm.default"],
            }
        # never the next RMSNorm's cast, at either level
        assert d["first_divergence"] is None or "layernorm" not in d["first_divergence"]["module"]
        lines = res.stdout.splitlines()
        assert lines[0].startswith("✔ within tolerance; first differs at") and lines[0].endswith(
            "down_proj (no counterpart)" if level == "ops" else "down_proj (Linear)"
        ), lines[0]
        assert "no divergence" not in lines[0] and max(map(len, lines)) <= 80
    # a tighter tolerance: the difference is a divergence, and the outputs differ beyond it
    res, d = diff(tmp_path / "kernel-a-modules.jsonl", tmp_path / "kernel-b-modules.jsonl", "--rtol", "1e-5")
    assert res.code == 1 and d["outputs"]["equal"] == "differ"
    assert res.stdout.splitlines()[1].startswith("  outputs differ: rel_err")


def test_flush_denormal_with_bitwise_equal_outputs_exits_0(tmp_path):
    for level in ("ops", "modules"):
        a, b = traces(tmp_path, "flush_denormal", level)
        res, d = diff(a, b)
        assert res.code == 0, res.stdout + res.stderr
        assert d["outputs"] == {
            "equal": "bitwise",
            "rel_err": 0.0,
            "tolerance": 1e-3,
            "calls": 1,
            "unpaired": 0,
        }
        fd = d["first_divergence"]
        assert fd["module"] == "side" and fd["inputs_agree"] is True and fd["rel_err"] <= 2
        if level == "ops":  # x * 1e-39 (subnormal against 0) agrees; the * 4e19 after it does not
            assert fd["op"] == "aten.mul.Tensor" and fd["a"]["absmax"] > 1e-21 and fd["b"]["absmax"] == 0
        assert d["max_rel_err"] <= 2
        lines = res.stdout.splitlines()
        assert lines[0].startswith("⚠ runs part at side (Whisper)")
        assert lines[1] == "  outputs bitwise equal: the divergence did not reach them"
        assert "flush_denormal" in lines[2]
        res, _ = diff(a, b, "--fail-on", "divergence")
        assert res.code == 1


def test_fail_on_refuses_other_values(tmp_path):
    a, b = traces(tmp_path, "flush_denormal", "modules")
    res = invoke("diff", a, b, "--fail-on", "anything")
    lines = res.stderr.strip().splitlines()
    assert res.code == 2 and len(lines) == 1 and "--fail-on" in lines[0] and "Traceback" not in res.stderr
