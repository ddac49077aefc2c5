"""Probe (issue 36): would one batched statistic per forward make a watched forward cheaper on CPU?

The fixed cost's --parts table (BENCHMARKS.md) suggested reading every tensor a forward's hooks see
in one call at the end of the root forward instead of one ``torch.aminmax`` per tensor at its hook.
This probe measures that, and reading through numpy instead of torch, without changing the package:
it patches the seams the sink reads through, on the shipped tiny Llama (fp32, one thread, no_grad).

* ``eager``: the watch as shipped (one ``aminmax`` into a reused buffer per new tensor, at its hook);
* ``batched``: no read at the hook (the tensor is only kept); at the end of the root forward, one
  ``torch._foreach_norm(kept, inf, dtype=float32)`` (absmax: NaN or inf when a tensor is not finite),
  one ``torch.stack`` and one ``tolist`` for all of them, under ``torch.no_grad`` when grad is on, as
  a deferred design must (the rows' values then come from the reused buffer: this measures time only);
* ``numpy``: at the hook, the tensor's numpy view's ``min()`` and ``max()`` instead of ``aminmax``.

Each variant's cost is measured as --parts does: N pairs of (10 plain forwards, 10 watched ones),
interleaved with the other variants, the median of the pairs' differences; plus the batched read's
own time per forward, and one ``aminmax``'s time inside a watched forward.

    python bench/probes/batched_statistic.py --pairs 150 --batch 1 --seq 1 --level blocks
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fixed_cost import build, per_forward  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1)
    ap.add_argument("--level", default="blocks")
    a = ap.parse_args(argv)

    import torch

    import nan_hunter
    from nan_hunter.capture import recorder, sink

    torch.set_num_threads(1)
    model, inputs = build(a.batch, a.seq)
    w = nan_hunter.watch(model, level=a.level)
    real_aminmax, real_finish = sink._aminmax, recorder.Recorder._finish
    kept: list = []
    settle_s: list[float] = []
    aminmax_s: list[float] = []

    def keep(t, out):
        kept.append(t)

    def finish_batched(self, forward):
        t0 = time.perf_counter()
        if kept:
            grad = torch.is_grad_enabled()
            with torch.no_grad() if grad else contextlib.nullcontext():
                torch.stack(torch._foreach_norm(kept, math.inf, dtype=torch.float32)).tolist()
            kept.clear()
        settle_s.append(time.perf_counter() - t0)
        real_finish(self, forward)

    def by_numpy(t, out):
        x = t.numpy()
        x.min(), x.max()

    def timed_aminmax(t, out):
        t0 = time.perf_counter()
        real_aminmax(t, out=out)
        aminmax_s.append(time.perf_counter() - t0)

    @contextlib.contextmanager
    def variant(name):
        if name == "batched":
            sink._aminmax, recorder.Recorder._finish = keep, finish_batched
        elif name == "numpy":
            sink._aminmax = by_numpy
        elif name == "timed":
            sink._aminmax = timed_aminmax
        try:
            with w:
                yield
        finally:
            sink._aminmax, recorder.Recorder._finish = real_aminmax, real_finish

    def block(n: int = 10) -> float:
        with torch.no_grad():
            return per_forward(lambda: model(**inputs), n)

    names = ["eager", "batched", "numpy"]
    for name in names:
        with variant(name):
            block(100)
    diffs: dict[str, list[float]] = {k: [] for k in names}
    for _ in range(a.pairs):
        for name in names:
            plain = block()
            with variant(name):
                diffs[name].append(block() - plain)
    with variant("timed"):
        block(100)
    med = {k: statistics.median(v) * 1e6 for k, v in diffs.items()}
    print(
        f"watched forward minus plain, median of {a.pairs} pairs of 10 forwards (level {a.level}, "
        f"batch {a.batch} x {a.seq}, load {os.getloadavg()[0]:.2f}):"
    )
    for k in names:
        pair = [x - y for x, y in zip(diffs[k], diffs["eager"])]
        print(
            f"  {k:8s} {med[k]:6.0f} µs   minus eager, median of pairs: {statistics.median(pair) * 1e6:+5.0f} µs"
        )
    print(
        f"  batched read at the end of a forward (foreach_norm + stack + tolist): "
        f"{statistics.median(settle_s) * 1e6:.0f} µs a forward"
    )
    print(
        f"  one aminmax inside a watched forward: {statistics.median(aminmax_s) * 1e6:.1f} µs "
        f"({len(aminmax_s) / 100:.1f} a forward)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
