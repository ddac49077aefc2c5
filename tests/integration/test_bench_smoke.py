"""The overhead benchmark's Llama path runs end to end on CPU (a 1-layer model, tiny shapes), so
the GPU run is not the first time the script executes: variants, equality checks, JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_overhead_bench_llama_smoke(tmp_path, capsys, monkeypatch):
    """In this process (the cap on tests that start one, tests/unit/test_test_layout.py)."""
    pytest.importorskip("transformers")
    import importlib.util

    import torch

    monkeypatch.setattr(sys, "path", [str(ROOT / "bench"), *sys.path])  # overhead.py imports bench/machine.py
    spec = importlib.util.spec_from_file_location("overhead_bench", ROOT / "bench" / "overhead.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "overhead_bench", bench)  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    out = tmp_path / "o.json"
    threads = torch.get_num_threads()
    try:
        rc = bench.main(
            [
                "--model",
                "llama",
                "--llama-layers",
                "1",
                "--shapes",
                "1x8,2x4",
                "--rounds",
                "1",
                "--iters",
                "1",
                "--ops-iters",
                "1",
                "--warmup",
                "1",
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert rc == 0, capsys.readouterr().out[-2000:]
    res = json.loads(out.read_text())
    assert set(res["shapes"]) == {"1x8", "2x4"}
    for shape in res["shapes"].values():
        v = shape["variants"]
        assert {"plain", "watch_blocks", "watch_modules", "watch_ops", "duo", "naive"} <= set(v)
        for name, row in v.items():
            assert row["error"] is None, (name, row["error"])
            assert row["bitwise_equal_to_plain"] is True, name
            assert row["median_ms"] > 0
    assert res["targets"]["1x8"]["watch_le_1.10x_plain"].keys() >= {"watch_blocks", "watch_modules"}


def test_train_overhead_bench_quick(tmp_path):
    """bench/train_overhead.py --quick (tiny Llama, 2 rounds): every variant trains, matches plain
    bit for bit, and gets its ratio line."""
    pytest.importorskip("transformers")
    out = tmp_path / "t.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "train_overhead.py"),
        "--quick",
        "--threads",
        "1",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for name in ("plain", "watch_blocks", "watch_modules", "detect_anomaly", "naive"):
        assert f"ratio {name}: " in proc.stdout, (name, proc.stdout[-2000:])
    rows = json.loads(out.read_text())["variants"]
    for name, row in rows.items():
        assert row["error"] is None, (name, row["error"])
        assert row["bitwise_equal_to_plain"] is True, name
        assert len(row["rounds_ms"]) == 2 and row["median_ms"] > 0, name
    assert rows["watch_blocks"]["report_clean"] is True and rows["watch_modules"]["report_clean"] is True


def test_fixed_cost_parts_runs_and_puts_every_seam_back(capsys):
    """bench/fixed_cost.py --parts switches parts of the watch off by patching the seams they run
    behind: one pair per variant runs every variant, and afterwards every patched attribute is the
    original again (an inherited one is inherited again), so nothing leaks into a later watch."""
    pytest.importorskip("transformers")
    import importlib.util

    import torch

    from nan_hunter.capture import listener, recorder, sink
    from nan_hunter.session import watcher

    spec = importlib.util.spec_from_file_location("fixed_cost_bench", ROOT / "bench" / "fixed_cost.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seams = [
        (listener.CaptureListener, "keeps_inputs"),
        (sink.StatsSink, "measure_host"),
        (recorder, "call_items"),
        (recorder, "float_items"),
        (recorder.Recorder, "_params"),
        (recorder.Recorder, "_fold"),
    ]
    before = {(o, a): getattr(o, a) for o, a in seams}
    own = {
        c: set(vars(c))
        for c in (*{o for o, _ in seams if isinstance(o, type)}, *vars(watcher).values())
        if isinstance(c, type)
    }
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--parts", "1", "--batch", "1", "--seq", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "the whole watch" in out and "hooks that do nothing" in out
    assert out.count("-> that part:") == 6 and "not measured" not in out
    assert all(getattr(o, a) is f for (o, a), f in before.items())
    assert all(set(vars(c)) == names for c, names in own.items())  # nothing added or left behind


def test_batched_statistic_probe_runs_and_puts_its_seams_back(capsys, monkeypatch):
    """bench/probes/batched_statistic.py (issue 36's measured alternative to one read per tensor)
    patches the sink's ``aminmax`` and ``Recorder._finish``: one pair of each variant runs, every
    variant is reported, and both seams are the package's own again afterwards."""
    pytest.importorskip("transformers")
    import importlib.util

    import torch

    from nan_hunter.capture import recorder, sink

    monkeypatch.setattr(sys, "path", list(sys.path))  # the probe puts bench/ on it
    spec = importlib.util.spec_from_file_location(
        "batched_statistic_probe", ROOT / "bench" / "probes" / "batched_statistic.py"
    )
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    before = (sink._aminmax, recorder.Recorder._finish)
    threads = torch.get_num_threads()
    try:
        assert probe.main(["--pairs", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert all(f"  {k} " in out for k in ("eager", "batched", "numpy"))
    assert "batched read at the end of a forward" in out and "one aminmax inside a watched forward" in out
    assert (sink._aminmax, recorder.Recorder._finish) == before


def test_gpu_truth_rehearsal_writes_its_three_files(tmp_path):
    """bench/gpu_truth.sh in its CPU rehearsal (issue 47), a few stages at the smallest sizes: the
    stage runner, the Python stages it calls (the Triton kernel interpreted, scan --trace on both
    sides and diff), the summary and the packing all run, and $OUT holds the three files."""
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "GPU_TRUTH_DEVICE": "cpu",
        "GPU_TRUTH_STAGES": "env,kernel,trace",
        "OUT": str(out),
        "GPU_TRUTH_KERNEL_MIB": "0.015625",
        "PY": sys.executable,
        "TMPDIR": str(tmp_path),
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_truth.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_truth_logs.tgz",
        "gpu_truth_summary.json",
        "gpu_truth_summary.md",
    ]
    res = json.loads((out / "gpu_truth_summary.json").read_text())
    stages = {s["stage"]: s for s in res["stages"]}
    assert set(stages) == {"env", "kernel", "trace", "trace_diff"}, stages
    assert all(s["rc"] == 0 for s in stages.values()), stages
    assert res["env"]["nan_hunter_from_checkout"] is True
    rows = res["kernel"]["rows"]
    assert {(r["dtype"], r["launcher"]) for r in rows} == {
        (d, x) for d in ("float32", "bfloat16") for x in ("stats_into", "stats_many_into")
    }
    assert all(r["correct"] and r["counts"] == {"nan": 3, "posinf": 2, "neginf": 4} for r in rows), rows
    assert res["trace_diff"]["exit_code"] == 0 and res["trace_diff"]["devices"] == ["cpu", "cpu"]
    with tarfile.open(out / "gpu_truth_logs.tgz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {
        "env.json",
        "kernel.json",
        "stages.tsv",
        "trace_cpu.jsonl",
        "trace_dev.jsonl",
        "trace_diff.json",
    } <= names
    assert "| kernel | 0 |" in (out / "gpu_truth_summary.md").read_text()
    assert not list(tmp_path.glob("gpu_truth_work.*"))  # the work folder is removed
