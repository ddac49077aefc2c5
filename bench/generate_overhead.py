"""Cost of capture across a greedy ``generate()`` (issue: generation, docs/contract.md).

Models, on the CPU with ``torch.set_num_threads(2)`` and fp32:

* ``tiny``: the shipped ``examples/tiny-llama-fp16`` (2 layers, hidden 64);
* ``llama100m``: a randomly initialised transformers Llama of about 100M parameters (hidden 768,
  12 layers, 12 heads, intermediate 2048, vocab 32000, tied embeddings).

Variants, measured in one process in interleaved rounds (the order rotates every round, after a
warm-up of each); the figure is the median over rounds of one 64-token greedy ``generate()``
(wall time; ``--clock cpu``: CPU time of the measuring thread, ``time.thread_time``, which with
``--threads 1`` is all of the work and counts other processes on a shared machine less)
(``do_sample=False``, ``min_new_tokens=max_new_tokens`` so every variant runs the same steps):

* ``plain``          ``model.generate(...)``
* ``watch_sentinel`` the same inside ``nan_hunter.watch(model)`` at its default level ``"sentinel"``
                   (a fresh watch per call; ``sample_every`` 100: a 64-token call samples none)
* ``watch_blocks``   the same inside ``nan_hunter.watch(model, level="blocks")`` (a fresh watch per call)
* ``watch_modules``  the same at ``level="modules"``
* ``duo``            transformers' ``DebugUnderflowOverflow(model)`` registered around the call

Also: the tokens of every variant are compared with plain's (they must be equal); and, with
``--rss-only`` in a process of its own, RSS after a watched generate of N = 16, 48 and 112 new
tokens (memory independent of N).

    python bench/generate_overhead.py                 # both models, 64 tokens, 5 rounds
    python bench/generate_overhead.py --models tiny --rounds 1 --tokens 8   # smoke test
    python bench/generate_overhead.py --threads 1 --clock cpu               # a shared, loaded machine
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def build(name: str):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if name == "tiny":
        model = AutoModelForCausalLM.from_pretrained(
            str(ROOT / "examples" / "tiny-llama-fp16"), dtype=torch.float32
        )
        ids = torch.tensor([[1, 63, 57, 20, 28]])
    else:
        torch.manual_seed(0)
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
        model = LlamaForCausalLM(cfg)
        ids = torch.randint(3, 32000, (1, 16), generator=torch.Generator().manual_seed(0))
    return model.eval(), ids


def variants(model, ids, tokens: int):
    import torch

    import nan_hunter

    def gen():
        with torch.no_grad():
            return model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=0,
            )

    def watched(level):
        def run():
            with nan_hunter.watch(model, level=level):
                return gen()

        return run

    def duo():
        from transformers.debug_utils import DebugUnderflowOverflow

        d = DebugUnderflowOverflow(model)
        try:
            return gen()
        finally:
            for m in model.modules():  # it leaves its hooks registered: remove them
                m._forward_hooks.clear()
            del d

    return {
        "plain": gen,
        "watch_sentinel": watched("sentinel"),
        "watch_blocks": watched("blocks"),
        "watch_modules": watched("modules"),
        "duo": duo,
    }


def measure(name: str, tokens: int, rounds: int, clock=time.perf_counter) -> dict:
    import torch

    model, ids = build(name)
    vs = variants(model, ids, tokens)
    ref = vs["plain"]()
    out: dict = {"params": sum(p.numel() for p in model.parameters()), "tokens": tokens, "same_tokens": {}}
    for k, fn in vs.items():  # warm-up, and the tokens must be the same as plain's
        out["same_tokens"][k] = bool(torch.equal(fn(), ref))
    times: dict[str, list[float]] = {k: [] for k in vs}
    order = list(vs)
    for r in range(rounds):
        for k in order[r % len(order) :] + order[: r % len(order)]:
            t = clock()
            vs[k]()
            times[k].append(clock() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    out["seconds"] = med
    out["ratio_vs_plain"] = {k: med[k] / med["plain"] for k in med}
    out["rounds_seconds"] = times
    return out


def rss_growth(name: str) -> dict:
    """Current RSS (MiB, VmRSS) after a watched generate of N tokens, for growing N (run first,
    in its own process, so no other model's memory is counted)."""
    import torch
    from machine import rss_mb

    import nan_hunter

    model, ids = build(name)
    res = {}
    for n in (16, 48, 112):  # the tiny model holds 128 positions
        with nan_hunter.watch(model, level="blocks"), torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
        res[n] = rss_mb()
    return res


def main() -> int:
    import torch
    from machine import cpu_name

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tiny,llama100m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--rss-only", action="store_true", help="only the RSS-against-N measurement")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: CPU time of the measuring thread (use with --threads 1)",
    )
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time if a.clock == "cpu" else time.perf_counter
    res = {
        "machine": {
            "cpu": cpu_name(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "clock": a.clock,
            "load_avg": os.getloadavg(),
        }
    }
    if a.rss_only:
        res["rss_mib_after_n_tokens"] = rss_growth(a.models.split(",")[0])
        print("RSS after watched generate of N tokens (MiB):", res["rss_mib_after_n_tokens"])
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=2))
        return 0
    for name in a.models.split(","):
        res[name] = measure(name, a.tokens, a.rounds, clock)
        r = res[name]["ratio_vs_plain"]
        print(
            f"{name} ({res[name]['params'] / 1e6:.1f}M params, {a.tokens} tokens): plain "
            f"{res[name]['seconds']['plain']:.3f}s; watch sentinel {r['watch_sentinel']:.3f}x, "
            f"blocks {r['watch_blocks']:.3f}x, modules "
            f"{r['watch_modules']:.3f}x, DebugUnderflowOverflow {r['duo']:.3f}x; same tokens: "
            f"{all(res[name]['same_tokens'].values())}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
