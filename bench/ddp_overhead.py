"""Cost of ``nan_hunter.watch`` on a 2-rank DDP training step (issue 17, docs/contract.md
"Distributed").

A transformers ``LlamaForCausalLM`` built from a small config (hidden 256, 4 layers, 4 heads,
intermediate 688, vocab 4096; 5.3M parameters), fp32 on the CPU, wrapped in
``DistributedDataParallel`` over gloo, 2 ranks of one thread each (``torchrun --nproc-per-node 2``,
which this script starts itself). One training step: forward of a (2, 128) batch with
``labels = input_ids``, ``loss.backward()`` (DDP's gradient all-reduce), ``AdamW.step()``.

Variants, measured in one run in interleaved rounds (the order rotates every round, after a
warm-up of each), each round ``--steps`` steps of each; the figures are the median wall-clock
time and the median CPU time (``time.process_time``: this process's threads, gloo's included) of
a step on rank 0. On a loaded machine the CPU time is the steadier measure of the work capture
adds; the wall time is what a user waits.

* ``plain``          the step as it is
* ``watch_blocks``   the same steps with ``nan_hunter.watch(model, level="blocks")`` attached (one
                     watch for the whole run, attached for its rounds, as a training loop keeps it)
* ``watch_backward`` the same with ``watch(model, level="blocks", backward=True)`` (gradients too)

Also: the collectives per step of each variant, counted with the profiler (each gloo collective
records a ``gloo:<name>`` event; must be equal), and the time of one collective ``report()``.

    python bench/ddp_overhead.py                    # 10 rounds of 3 steps
    python bench/ddp_overhead.py --rounds 1 --steps 1  # smoke test
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def build():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg)


def collectives(fn) -> dict[str, int]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return dict(collections.Counter(e.name for e in prof.events() if e.name.startswith("gloo:")))


def worker(rounds: int, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import nan_hunter

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(build())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randint(3, 4096, (2, 128), generator=gen) for _ in range(4)]
    n = [0]

    def step() -> None:
        ids = batches[n[0] % len(batches)]
        n[0] += 1
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    def watched(w):
        def run() -> None:
            w.attach()
            try:
                step()
            finally:
                w.detach()

        return run

    w = nan_hunter.watch(model, level="blocks")
    wb = nan_hunter.watch(model, level="blocks", backward=True)
    variants = {"plain": step, "watch_blocks": watched(w), "watch_backward": watched(wb)}
    for fn in variants.values():  # warm-up (DDP's first step also rebuilds its buckets)
        fn()
        fn()
    per_step = {k: collectives(fn) for k, fn in variants.items()}
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    order = list(variants)
    for r in range(rounds):
        for k in order[r % len(order) :] + order[: r % len(order)]:
            for _ in range(steps):
                dist.barrier()
                t, c = time.perf_counter(), time.process_time()
                variants[k]()
                times[k].append(time.perf_counter() - t)
                cpu[k].append(time.process_time() - c)
    t = time.perf_counter()
    rep = w.report()
    report_s = time.perf_counter() - t
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        res = {
            "params": sum(p.numel() for p in model.parameters()),
            "world": dist.get_world_size(),
            "steps_timed": {k: len(v) for k, v in times.items()},
            "seconds_per_step": med,
            "ratio_vs_plain": {k: med[k] / med["plain"] for k in med},
            "cpu_seconds_per_step": med_cpu,
            "cpu_ratio_vs_plain": {k: med_cpu[k] / med_cpu["plain"] for k in med},
            "collectives_per_step": per_step,
            "report_seconds": report_s,
            "report_first_nonfinite": rep.to_dict()["first_nonfinite"],
            "forwards_watched": w.n_forwards,
        }
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3, help="steps of each variant per round")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # set by the torchrun this script starts
    a = ap.parse_args()
    if a.worker:
        worker(a.rounds, a.steps, a.worker)
        return 0
    import tempfile

    import torch
    from machine import cpu_name

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "rank0.json")
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            __file__,
            "--rounds",
            str(a.rounds),
            "--steps",
            str(a.steps),
            "--worker",
            str(out),
        ]
        subprocess.run(cmd, check=True, env=env, timeout=1800)
        res = json.loads(out.read_text())
    res["machine"] = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads_per_rank": 1,
        "load_avg": os.getloadavg(),
    }
    s, r, c = res["seconds_per_step"], res["ratio_vs_plain"], res["collectives_per_step"]
    print(
        f"DDP {res['world']} ranks, {res['params'] / 1e6:.1f}M params, {res['steps_timed']['plain']} steps "
        f"each: plain {s['plain'] * 1e3:.1f} ms/step; watch blocks {s['watch_blocks'] * 1e3:.1f} ms/step "
        f"({r['watch_blocks']:.3f}x); with backward=True {s['watch_backward'] * 1e3:.1f} ms/step "
        f"({r['watch_backward']:.3f}x)"
    )
    cr = res["cpu_ratio_vs_plain"]
    print(
        f"CPU time per step: watch blocks {cr['watch_blocks']:.3f}x, backward=True {cr['watch_backward']:.3f}x"
    )
    print(
        f"collectives per step: plain {c['plain']}, watch blocks {c['watch_blocks']}, backward=True "
        f"{c['watch_backward']}; "
        f"report(): {res['report_seconds'] * 1e3:.1f} ms; load average {res['machine']['load_avg']}"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
