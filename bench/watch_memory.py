"""Resident memory of one ``nan_hunter.watch`` left on over many forwards of a small model.

The model: three residual blocks of ``Linear(16, 16)`` + GELU in an ``nn.ModuleList`` and a
``Linear(16, 2)`` head (9 modules, what issue 13 measured), fp32, batch 4 × 16, under
``torch.no_grad()``, ``torch.set_num_threads(1)``. One ``watch`` (``--level``, default
``modules``: every module hooked) is entered once around all ``--forwards`` forwards (default
100,000); RSS (``/proc/self/status`` VmRSS) is printed every ``--every`` forwards, with the
watch's kept calls, the sink's rows in use and its row capacity. Forward ``--fail-at`` (default
1000) gets an input that overflows fp32, so the first failing forward must be kept whatever
comes after it; ``report()`` runs at the end and must name it (module and aten op).

    python bench/watch_memory.py [--forwards 100000] [--every 10000] [--level modules] [--json out.json]

``--train STEPS``: instead, a training loop left watched (issue 36: memory flat over 10k steps): a
5-layer MLP 32 wide (``nn.ModuleList`` of Linear + GELU, ``torch.set_num_threads(1)``), batch 8,
``AdamW``, under ``watch(level=--level, backward=True, optimizer=opt, on_fault="skip")``; RSS and
the same counts every ``--every`` steps. A healthy run: no fault to report, and ``report()`` must
say so.

    python bench/watch_memory.py --train 10000 --every 1000 --level blocks

``--level sentinel`` measures the default level; ``--tracemalloc`` adds Python's traced memory to
every sample. At the end both print their least-squares slope per 1,000 forwards/steps from the
second sample on (the first holds the warm-up and, for forwards, the kept failing one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name, rss_mb  # noqa: E402

import nan_hunter  # noqa: E402


class Net(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


class MLP(nn.Module):
    def __init__(self, width: int = 32, depth: int = 5):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _counts(w) -> dict:
    sink = getattr(w, "sink", None)
    n = getattr(sink, "n", 0)
    return {
        "calls_kept": len(getattr(w, "calls", ())),
        "rows_in_use": getattr(sink, "rows_in_use", n),
        "row_capacity": n,
    }


def _traced_mb() -> float | None:
    return tracemalloc.get_traced_memory()[0] / 2**20 if tracemalloc.is_tracing() else None


def _sample(i: int, w, t0: float) -> dict:
    return {
        "step": i,
        "rss_mb": round(rss_mb(), 1),
        **_counts(w),
        "traced_mb": _traced_mb(),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def slope(samples: list[dict], x: str, y: str, skip: int = 1) -> float | None:
    """Least-squares slope of ``y`` over ``x`` (per 1,000), from the ``skip``-th sample on (the first
    ones hold the warm-up and the kept failing step)."""
    pts = [(s[x], s[y]) for s in samples[skip:] if s.get(y) is not None]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return None if den == 0 else 1000 * sum((p[0] - mx) * (p[1] - my) for p in pts) / den


def _slopes(samples: list[dict], x: str) -> dict:
    out = {f"{y}_per_1k": slope(samples, x, y) for y in ("rss_mb", "traced_mb")}
    print(
        "slope from the second sample on: RSS "
        + (f"{out['rss_mb_per_1k']:+.4f} MB" if out["rss_mb_per_1k"] is not None else "n/a")
        + (f", tracemalloc {out['traced_mb_per_1k']:+.5f} MB" if out["traced_mb_per_1k"] is not None else "")
        + f" per 1,000 {x}"
    )
    return out


def train(a) -> None:
    """``--train``: RSS over a watched training loop (see the module docstring)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MLP().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 32), torch.randn(8, 1)
    samples = []
    t0 = time.perf_counter()
    print(f"{'steps':>9} {'RSS MB':>8} {'calls kept':>10} {'rows in use':>11} {'row capacity':>12} {'s':>7}")
    with nan_hunter.watch(model, level=a.level, backward=True, optimizer=opt, on_fault="skip") as w:
        for i in range(a.train + 1):
            if i % a.every == 0:
                s = _sample(i, w, t0)
                samples.append(s)
                print(
                    f"{i:>9} {s['rss_mb']:>8} {s['calls_kept']:>10} {s['rows_in_use']:>11} "
                    f"{s['row_capacity']:>12} {s['seconds']:>7}",
                    flush=True,
                )
            if i == a.train:
                break
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    r = w.report()
    print(f"report(): first_nonfinite {r.first_nonfinite}; RSS after report: {rss_mb():.1f} MB")
    out = {
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "load_avg": os.getloadavg(),
        },
        "level": a.level,
        "train_steps": a.train,
        "samples": samples,
        "slope": _slopes(samples, "step"),
        "fault": r.first_nonfinite is not None,
        "rss_after_report_mb": round(rss_mb(), 1),
    }
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2))
    if r.first_nonfinite is not None:
        raise SystemExit("a healthy training run reported a fault")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forwards", type=int, default=100_000)
    ap.add_argument("--train", type=int, default=0, help="training steps instead of forwards (see above)")
    ap.add_argument("--every", type=int, default=10_000)
    ap.add_argument("--level", default="modules", choices=["sentinel", "blocks", "modules", "ops"])
    ap.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations (slower)")
    ap.add_argument("--fail-at", type=int, default=1000)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.tracemalloc:
        tracemalloc.start()
    if a.train:
        train(a)
        return

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(4, 16)
    bad = torch.full((4, 16), 3e38)  # x + layer(x) passes the fp32 max in the first block
    samples = []
    t0 = time.perf_counter()
    print(
        f"{'forwards':>9} {'RSS MB':>8} {'calls kept':>10} {'rows in use':>11} {'row capacity':>12} {'s':>7}"
    )
    with torch.no_grad(), nan_hunter.watch(model, level=a.level) as w:
        for i in range(a.forwards + 1):
            if i % a.every == 0:
                s = {
                    "forwards": i,
                    "rss_mb": round(rss_mb(), 1),
                    **_counts(w),
                    "traced_mb": _traced_mb(),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
                samples.append(s)
                print(
                    f"{i:>9} {s['rss_mb']:>8} {s['calls_kept']:>10} {s['rows_in_use']:>11} "
                    f"{s['row_capacity']:>12} {s['seconds']:>7}",
                    flush=True,
                )
            if i == a.forwards:
                break
            model(bad if i == a.fail_at else x)
    t = time.perf_counter()
    r = w.report()
    f = r.first_nonfinite
    report_s = time.perf_counter() - t
    print(
        f"report() in {report_s:.2f} s: forward {f.input_index}, {f.module} ({f.module_type}), {f.op}, {f.kind}; "
        f"failed_inputs {r.failed_inputs}"
    )
    print(f"RSS after report: {rss_mb():.1f} MB")
    out = {
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "load_avg": os.getloadavg(),
        },
        "level": a.level,
        "forwards": a.forwards,
        "fail_at": a.fail_at,
        "samples": samples,
        "slope": _slopes(samples, "forwards"),
        "report": {
            "seconds": round(report_s, 2),
            "input_index": f.input_index,
            "module": f.module,
            "op": f.op,
            "failed_inputs": r.failed_inputs,
        },
        "rss_after_report_mb": round(rss_mb(), 1),
    }
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
