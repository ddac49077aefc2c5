"""The capsule shipped in examples/capsules (written by examples/train_fp16_adam.py) replays
through the real CLI in a fresh process, and the scan leaves it unchanged."""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAPSULE = ROOT / "examples" / "capsules" / "adam-eps-fp16" / "step-0"


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        h.update(p.name.encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_shipped_adam_capsule_replays(cli_main):
    before = _digest(CAPSULE)
    res = cli_main("scan", CAPSULE)
    assert res.code == 1, res.stderr
    r = res.report
    f = r["first_nonfinite"]
    assert (f["phase"], f["step"], f["param"], f["module"]) == (
        "optimizer",
        0,
        "model.embed_tokens.weight",
        "model.embed_tokens",
    )
    assert f["op"] == "aten.addcdiv_.default" and f["kind"] == "nan"
    assert r["diagnosis"]["cause"] == "division_by_zero"
    assert "fp32 master weights" in r["diagnosis"]["fix"]
    assert r["checkpoint"]["format"] == "capsule"
    assert _digest(CAPSULE) == before
