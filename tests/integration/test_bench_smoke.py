"""The overhead benchmark's Llama path runs end to end on CPU (a 1-layer model, tiny shapes), so
the GPU run is not the first time the script executes: variants, equality checks, JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_overhead_bench_llama_smoke(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "o.json"
    cmd = [sys.executable, str(ROOT / "bench" / "overhead.py"), "--model", "llama", "--llama-layers", "1",
           "--shapes", "1x8,2x4", "--rounds", "1", "--iters", "1", "--ops-iters", "1", "--warmup", "1",
           "--threads", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
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
    cmd = [sys.executable, str(ROOT / "bench" / "train_overhead.py"), "--quick", "--threads", "1", "--json", str(out)]
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
    seams = [(listener.CaptureListener, "keeps_inputs"), (sink.StatsSink, "measure_host"),
             (recorder, "call_items"), (recorder, "float_items"), (recorder.Recorder, "_params"),
             (recorder.Recorder, "_fold")]
    before = {(o, a): getattr(o, a) for o, a in seams}
    own = {c: set(vars(c)) for c in (*{o for o, _ in seams if isinstance(o, type)}, *vars(watcher).values())
           if isinstance(c, type)}
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
    spec = importlib.util.spec_from_file_location("batched_statistic_probe",
                                                  ROOT / "bench" / "probes" / "batched_statistic.py")
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
