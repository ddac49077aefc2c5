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
