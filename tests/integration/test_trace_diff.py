"""``scan --trace`` and ``nanhunter diff``: the real uses, through the real command (in this
process, ``invoke``; in a process of its own where the thread count or the interpreter differs).

- this torch against another torch (the interpreter in ``NANHUNTER_OTHER_PYTHON``; CI's torch 2.15.0
  and 2.14.1 passes set it to the floors venv's, torch 2.13.0) on a tiny Llama built from a config with fixed weights;
- ``torch.set_flush_denormal(True)`` against the default on a model that divides by a subnormal:
  the first divergence is that division;
- 1 against 2 threads: within tolerance, exit 0, the thread count named as a difference;
- eager against compiled (inductor on CPU) where compile changes fp16 numbers: exit 1, the module
  named (the compiled trace records each module compiled alone on eager's inputs);
- different models, different inputs, and broken files: exit 2, one line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from clirun import ROOT, cli_env, invoke, run_cli
from models import trace_nets

LLAMA = ROOT / "examples/tiny-llama-fp16"
NETS = ROOT / "tests/models/trace_nets.py"
OTHER_PYTHON = os.environ.get("NANHUNTER_OTHER_PYTHON")


@pytest.fixture(scope="module")
def denormal(tmp_path_factory) -> dict[str, Path]:
    return trace_nets.save(tmp_path_factory.mktemp("denormal"))


def _trace(out: Path, *scan_args: object, env: dict | None = None, level: str = "modules") -> Path:
    """``scan ... --trace OUT`` in this process."""
    code, _, err = invoke(*_trace_args(out, scan_args, level), env=env)
    assert code in (0, 1), err
    assert out.exists(), err
    return out


def _trace_in_a_process(
    out: Path, *scan_args: object, env: dict | None = None, level: str = "modules", python: str | None = None
) -> Path:
    """``scan ... --trace OUT`` in a process of its own, where its start is the point: a thread count
    set by OMP_NUM_THREADS, or ``python``, another interpreter (another torch) on this checkout's code."""
    args = _trace_args(out, scan_args, level)
    if python is None:
        res = run_cli(*args, env=env, timeout=600)
    else:
        proc = subprocess.run(
            [python, "-m", "nan_hunter", *map(str, args)],
            capture_output=True,
            text=True,
            env=cli_env({**(env or {}), "PYTHONPATH": str(ROOT)}),
            cwd=ROOT,
            timeout=600,
        )
        res = (proc.returncode, proc.stdout, proc.stderr)
    code, _, err = res
    assert code in (0, 1), err
    assert out.exists(), err
    return out


def _trace_args(out: Path, scan_args: tuple, level: str) -> list[object]:
    return ["scan", *scan_args, "--trace", out, "--trace-level", level, "-q"]


def _diff(a: Path, b: Path, tmp: Path, *extra: object):
    js = tmp / f"diff-{a.stem}-{b.stem}.json"
    res = invoke("diff", a, b, "--json", js, *extra, env={"COLUMNS": "80"})
    return res, (json.loads(js.read_text()) if js.exists() else None)


def _llama(prompt: str = "the quick brown fox") -> list[object]:
    return [LLAMA, "--prompt", prompt, "--dtype", "fp32"]


def test_flush_denormal_first_divergence_is_the_division(tmp_path, denormal):
    arch = f"{NETS}:build"
    for level in ("ops", "modules"):
        a = _trace(
            tmp_path / f"default-{level}.jsonl",
            denormal["ck"],
            "--arch",
            arch,
            "--inputs",
            denormal["inputs"],
            level=level,
        )
        b = _trace(
            tmp_path / f"ftz-{level}.jsonl",
            denormal["ck"],
            "--arch",
            f"{NETS}:build_ftz",
            "--inputs",
            denormal["inputs"],
            level=level,
        )
        res, d = _diff(a, b, tmp_path)
        assert res.code == 1, res.stderr
        fd = d["first_divergence"]
        assert (fd["module"], fd["module_type"]) == ("mid", "DivScale")
        assert fd["op"] == ("aten.div.Tensor" if level == "ops" else None)
        assert fd["classes_differ"] is True and fd["inputs_agree"] is True
        assert fd["b"]["posinf"] + fd["b"]["neginf"] > 0 and fd["a"]["posinf"] == 0
        assert {"key": "flush_denormal", "a": False, "b": True} in d["env_diff"]
        assert d["first_nonfinite"]["a"] is None and d["first_nonfinite"]["b"]["module"] == "mid"
        lines = res.stdout.splitlines()
        assert lines[0].startswith("✘ runs part at mid (DivScale)") and "flush_denormal" in lines[2]
        assert lines[1] == "  outputs differ: non-finite classes differ"
        assert max(map(len, lines)) <= 80


def test_one_against_two_threads_is_within_tolerance(tmp_path):
    a = _trace_in_a_process(tmp_path / "t1.jsonl", *_llama(), env={"OMP_NUM_THREADS": "1"}, level="ops")
    b = _trace_in_a_process(tmp_path / "t2.jsonl", *_llama(), env={"OMP_NUM_THREADS": "2"}, level="ops")
    res, d = _diff(a, b, tmp_path)
    assert res.code == 0, res.stdout + res.stderr
    assert {"key": "threads", "a": 1, "b": 2} in d["env_diff"]
    assert d["first_divergence"] is None and d["compared"] > 50 and d["unmatched"] == {"a": 0, "b": 0}
    assert res.stdout.startswith("✔") and "threads" in res.stdout.splitlines()[2]
    assert d["outputs"]["equal"] in ("bitwise", "within_tolerance")


@pytest.mark.slow
def test_eager_against_compiled_fp16(tmp_path):
    ck = trace_nets.save(tmp_path, trace_nets.build_cancel)
    common = [ck["ck"], "--arch", f"{NETS}:build_cancel", "--inputs", ck["inputs"], "--dtype", "fp16"]
    a = _trace(tmp_path / "eager.jsonl", *common)
    b = _trace(tmp_path / "compiled.jsonl", *common, "--compile")
    res, d = _diff(a, b, tmp_path)
    assert res.code == 1, res.stdout + res.stderr
    assert {"key": "compile", "a": None, "b": "inductor"} in d["env_diff"]
    fd = d["first_divergence"]
    # the compiled trace records each module compiled alone on eager's inputs: the module is named
    assert (fd["module"], fd["module_type"]) == ("mid", "Cancel") and fd["inputs_agree"] is True
    assert fd["rel_err"] > 1e-2 and fd["tolerance"] == 1e-2  # fp16 entries
    assert d["unmatched"] == {"a": 0, "b": 0} and d["outputs"]["equal"] == "differ"
    assert any("compiled alone on eager's inputs" in n for n in d["notes"])


def test_different_models_and_inputs_exit_2(tmp_path, denormal):
    llama = _trace(tmp_path / "llama.jsonl", *_llama())
    other_prompt = _trace(tmp_path / "llama-other.jsonl", *_llama("a different prompt"))
    net = _trace(
        tmp_path / "net.jsonl", denormal["ck"], "--arch", f"{NETS}:build", "--inputs", denormal["inputs"]
    )
    for b, words in (
        (net, "different models: module names differ"),
        (other_prompt, "different inputs: input #0"),
    ):
        res, d = _diff(llama, b, tmp_path)
        assert res.code == 2 and d is None
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in res.stderr, res.stderr


def test_repeat_stores_spread(tmp_path):
    t = _trace(tmp_path / "r.jsonl.gz", *_llama(), "--repeat", "3", level="ops")
    from nan_hunter.trace.reader import read_trace

    tr = read_trace(t)
    assert tr.header.repeat == 3 and tr.entries
    assert all(e.spread == 0.0 for e in tr.entries)  # CPU kernels are deterministic
    res, d = _diff(t, t, tmp_path)
    assert res.code == 0


def test_capsule_replay_writes_a_trace(tmp_path):
    cap = ROOT / "examples/capsules/adam-eps-fp16/step-0"
    res = invoke("scan", cap, "--trace", tmp_path / "cap.jsonl", "-q")
    assert res.code in (0, 1), res.stderr
    from nan_hunter.trace.reader import read_trace

    tr = read_trace(tmp_path / "cap.jsonl")
    assert tr.entries and tr.header.inputs[0]["label"] == "capsule step-0"


@pytest.mark.skipif(
    not OTHER_PYTHON,
    reason="NANHUNTER_OTHER_PYTHON is not set: no second torch to compare with "
    "(CI's torch 2.15.0 and 2.14.1 passes set it to the floors venv's)",
)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_two_torch_versions_on_a_tiny_llama(tmp_path, dtype):
    probe = subprocess.run(
        [OTHER_PYTHON, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr
    import torch

    assert probe.stdout.strip() != torch.__version__, "NANHUNTER_OTHER_PYTHON runs the same torch as this one"
    args = [LLAMA, "--prompt", "the quick brown fox jumps", "--dtype", dtype]
    a = _trace(tmp_path / "this.jsonl", *args, level="ops")
    b = _trace_in_a_process(tmp_path / "other.jsonl", *args, level="ops", python=OTHER_PYTHON)
    res, d = _diff(a, b, tmp_path)
    assert res.code in (0, 1), res.stderr
    assert {"key": "versions.torch", "a": torch.__version__, "b": probe.stdout.strip()} in d["env_diff"]
    assert d["compared"] > 50
    if res.code == 1:  # a version that computes differently: the op is named
        assert d["first_divergence"]["op"].startswith("aten.")


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("not a trace", "hello\n", "not a nanhunter trace"),
        ("another schema", '{"schema": "nanhunter.report/v1"}\n', "expected 'nanhunter.trace/v1'"),
    ],
)
def test_bad_files_exit_2_one_line(tmp_path, name, content, words):
    good = tmp_path / "good.jsonl"
    from unit.divergence.synthetic import entry, write

    write(good, [entry("m", "aten.mm.default", producers=[None])])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    truncated = tmp_path / "cut.jsonl"
    truncated.write_text("".join(good.read_text().splitlines(keepends=True)[:-1]))
    for other, w in ((bad, words), (truncated, "cut short"), (tmp_path / "missing.jsonl", "no such file")):
        res = invoke("diff", good, other)
        lines = res.stderr.strip().splitlines()
        assert res.code == 2 and len(lines) == 1 and w in lines[0] and "Traceback" not in res.stderr, (
            res.stderr
        )


HOSTILE = "evil\x1b[2J\u202e<script>alert(1)</script>"
HOSTILE_ARCH = f"""
from torch import nn

def build():
    m = nn.Sequential()
    m.add_module("first", nn.Linear(4, 4))
    m.add_module({HOSTILE!r}, nn.Linear(4, 4))
    return m
"""


def test_strings_from_traces_are_escaped_in_terminal_and_html(tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "hostile.py").write_text(HOSTILE_ARCH)
    torch.manual_seed(0)
    w = {
        "first.weight": torch.randn(4, 4),
        "first.bias": torch.zeros(4),
        f"{HOSTILE}.weight": torch.randn(4, 4),
        f"{HOSTILE}.bias": torch.zeros(4),
    }
    save_file(w, str(tmp_path / "a.safetensors"))
    save_file({**w, f"{HOSTILE}.weight": w[f"{HOSTILE}.weight"] * 2}, str(tmp_path / "b.safetensors"))
    save_file({"input": torch.randn(2, 4)}, str(tmp_path / "x.safetensors"))
    traces = [
        _trace(
            tmp_path / f"{s}.jsonl",
            tmp_path / f"{s}.safetensors",
            "--arch",
            f"{tmp_path / 'hostile.py'}:build",
            "--inputs",
            tmp_path / "x.safetensors",
        )
        for s in ("a", "b")
    ]
    res, d = _diff(*traces, tmp_path, "--report", tmp_path / "d.html")
    assert res.code == 1, res.stderr
    assert d["first_divergence"]["module"] == HOSTILE  # different weights: the first entry that reads them
    assert "\x1b" not in res.stdout and "\u202e" not in res.stdout and "\\x1b" in res.stdout
    assert max(map(len, res.stdout.splitlines())) <= 80
    page = (tmp_path / "d.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page and "\x1b" not in page
    assert re.search(r"<svg[^>]*>.*first divergence", page, re.S)
    assert page.count("<script") == 0 and "http://" not in page.replace("http://www.w3.org/2000/svg", "")


def test_diff_help_and_version_flags():
    res = invoke("diff", "--help")
    assert res.code == 0 and "--rtol" in res.stdout and "--report" in res.stdout
