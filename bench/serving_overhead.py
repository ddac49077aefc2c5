"""Cost of a watch around transformers' continuous batching (issue 49, docs/serving.md).

A randomly initialised fp32 Llama (hidden 256, 4 layers, 8 heads, vocab 4096) on the CPU serves
8 requests of 16 prompt tokens, 32 greedy new tokens each, through ``model.generate_batch`` (the
real ``ContinuousBatchingManager``; paged cache of 64 blocks × 32 tokens, no CUDA graphs, sync
batching). Variants, interleaved in rounds after one warm-up each (the order rotates):

* ``plain``        ``generate_batch(...)``
* ``watch``        the same inside ``nan_hunter.watch(model)`` (a fresh watch per call)
* ``watch_abort``  the same with ``on_fault="abort"`` (nothing fails: the per-forward check only)

Figures: median over rounds of the wall time and the process CPU time (the manager decodes in
its own thread) of one ``generate_batch``, tokens/s, and the ratio to plain. Every variant's tokens
are compared with plain's (they must be equal).

    python bench/serving_overhead.py                  # 5 rounds
    python bench/serving_overhead.py --rounds 1 --tokens 4   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 4096, (16,), generator=g).tolist() for _ in range(8)]
    return model, prompts


def run(model, prompts, tokens: int, variant: str) -> tuple[float, float, dict]:
    import contextlib

    from transformers import ContinuousBatchingConfig, GenerationConfig

    import nan_hunter

    gen = GenerationConfig(max_new_tokens=tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cbc = ContinuousBatchingConfig(
        page_size=32,
        num_blocks=64,
        max_batch_tokens=256,
        max_requests_per_batch=8,
        use_cuda_graph=False,
        use_async_batching=False,
    )
    ctx = (
        contextlib.nullcontext()
        if variant == "plain"
        else nan_hunter.watch(model, on_fault="abort" if variant == "watch_abort" else "record")
    )
    t, c = time.perf_counter(), time.process_time()
    with ctx:
        out = model.generate_batch(
            prompts, generation_config=gen, continuous_batching_config=cbc, progress_bar=False
        )
    return (
        time.perf_counter() - t,
        time.process_time() - c,
        {k: list(v.generated_tokens) for k, v in out.items()},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    model, prompts = build()
    variants = ["plain", "watch", "watch_abort"]
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    ref = None
    for v in variants:  # warm-up
        run(model, prompts, a.tokens, v)
    for r in range(a.rounds):
        for v in variants[r % 3 :] + variants[: r % 3]:
            w, c, toks = run(model, prompts, a.tokens, v)
            ref = ref if ref is not None else (toks if v == "plain" else None)
            if ref is not None and toks != ref:
                raise SystemExit(f"{v}: tokens differ from plain")
            wall[v].append(w)
            cpu[v].append(c)
    n = len(prompts) * a.tokens
    rows = {}
    for v in variants:
        mw, mc = statistics.median(wall[v]), statistics.median(cpu[v])
        rows[v] = {
            "wall_s": mw,
            "cpu_s": mc,
            "tokens_per_s": n / mw,
            "wall_ratio": mw / statistics.median(wall["plain"]),
            "cpu_ratio": mc / statistics.median(cpu["plain"]),
            "spread_wall": [min(wall[v]), max(wall[v])],
        }
        print(
            f"{v:12s} wall {mw:6.2f} s  cpu {mc:6.2f} s  {n / mw:7.1f} tok/s  "
            f"×{rows[v]['wall_ratio']:.2f} wall  ×{rows[v]['cpu_ratio']:.2f} cpu  "
            f"(wall {min(wall[v]):.2f}–{max(wall[v]):.2f})"
        )
    out = ROOT / "bench" / "_out"
    out.mkdir(exist_ok=True)
    (out / "serving_overhead.json").write_text(
        json.dumps(
            {"rounds": a.rounds, "tokens": a.tokens, "requests": 8, "load": os.getloadavg(), "rows": rows},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
