"""Diff two parity logs (``sitecustomize.py``): every scan recorded in both, by key, field by field.

``python tests/parity/compare.py BEFORE_DIR AFTER_DIR`` prints the keys scanned in both, the ones
that differ (with the first differing fields) and how many were scanned in one log only; exit 1
when any differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(d: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in sorted(Path(d).glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if r.get("key"):
                out.setdefault(r["key"], []).append(r)
    return out


def outcome(r: dict):
    """The weights block, or the error with the checkpoint's own path (a temporary folder) left out."""
    return {"error": r["error"].replace(r["path"], "<checkpoint>")} if "error" in r else r.get("weights")


def diffs(a, b, path: str = "") -> list[str]:
    if type(a) is not type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: {'missing before' if k not in a else 'missing after'}")
            else:
                out += diffs(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)} items"]
        return [x for i, (u, v) in enumerate(zip(a, b)) for x in diffs(u, v, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main(before: str, after: str) -> int:
    a, b = load(before), load(after)
    both = sorted(set(a) & set(b))
    bad = 0
    for k in both:
        ra, rb = a[k][0], b[k][0]
        d = diffs(outcome(ra), outcome(rb))
        if d:
            bad += 1
            print(f"DIFF {ra['path']} (exact={ra['exact']}, {ra['format']}):")
            for line in d[:8]:
                print("   ", line[:300])
    print(
        f"{len(both)} scans in both logs, {bad} differ; {len(set(a) - set(b))} only before, "
        f"{len(set(b) - set(a))} only after"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
