"""The Python stages of ``bench/gpu_truth.sh`` (issue 47): each subcommand writes one JSON file.

Every stage takes ``--device cuda`` (the lent GPU) or ``--device cpu`` (the rehearsal on a machine
without one: the same code with small sizes, the CUDA-only readings recorded as null), so the GPU
call does not meet a line for the first time.

* ``env``       the environment line: driver, device, python, torch, triton, transformers, and the
                nan_hunter that was imported (it must be this checkout's, by PYTHONPATH)
* ``kernel``    the Triton statistics kernel (``stats_into``, ``stats_many_into``) on one tensor of
                ``--mib`` MiB in fp32 and bf16 with NaN, +inf and -inf planted at known places
                (counted separately, checked against the plant and against the torch reference
                ``full_row``), timed against the device's measured copy bandwidth (bytes read +
                written); target: kernel bytes read / s >= 0.70 x copy. A torch profile of a few
                launches is kept in the JSON (the explanation when the target is missed). On CPU it
                runs interpreted (``TRITON_INTERPRET=1``, set by the shell script).
* ``forward``   a randomly initialised Llama (``--model llama1b``: TinyLlama's shape, ~1.1B, or
                ``tiny``) in bf16, eval, ``torch.no_grad()``: plain, ``nan_hunter.watch`` at the
                default level and at ``modules`` (a fresh watch per forward),
                transformers' ``DebugUnderflowOverflow`` and naive ``isfinite().all().item()``
                forward hooks, in interleaved rounds; outputs compared bitwise with plain; host
                syncs per forward counted (``torch.cuda.set_sync_debug_mode("warn")``, and the
                ``cudaStreamSynchronize``/``cudaDeviceSynchronize``/``cudaEventSynchronize`` calls
                the profiler sees); for the watches also forward + ``report()``.
* ``train``     the same model in fp32 with bf16 autocast (on CUDA), AdamW: one training step
                (forward, loss, backward, step, zero_grad) per timed call, for plain, the watch at
                the default level and at ``modules`` (``backward=True, optimizer=opt``), DUO and the
                naive hooks (forward outputs, their gradients, parameter gradients); syncs per step.
* ``compare``   the ``scan`` JSON reports of the examples on the two devices, field by field.
* ``summary``   every stage's JSON and the stage table (name, exit code, seconds, budget) into
                ``summary.json`` and ``summary.md``.

    python bench/gpu_truth.py kernel --device cpu --mib 0.25 --out /tmp/k.json   # TRITON_INTERPRET=1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # overhead.py and train_overhead.py import bench/machine.py
    sys.path.insert(0, str(HERE))

KERNEL_TARGET = 0.70
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


def _write(path: str, data: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2, default=str))
    print(f"wrote {path}", flush=True)


def _err(e: BaseException) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"[:400]


# -- env ------------------------------------------------------------------------------------------
def cmd_env(args) -> int:
    import torch

    import nan_hunter

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "numpy": _version("numpy"),
        "pytest": _version("pytest"),
        "pytest_xdist": _version("pytest-xdist"),
        "nan_hunter_file": nan_hunter.__file__,
        "cuda_available": torch.cuda.is_available(),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        "cpu_count": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    root = Path(args.root).resolve()
    out["nan_hunter_from_checkout"] = Path(nan_hunter.__file__).resolve().is_relative_to(root)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(
            device=torch.cuda.get_device_name(0),
            capability=list(torch.cuda.get_device_capability(0)),
            sms=p.multi_processor_count,
            memory_GiB=round(p.total_memory / 2**30, 1),
        )
    else:
        out["device"] = f"cpu ({platform.processor() or platform.machine()})"
    if shutil.which("nvidia-smi"):
        try:
            q = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=20,
            )
            out["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
            out["driver"] = q.stdout.split(",")[1].strip() if q.stdout.count(",") >= 1 else None
        except Exception as e:  # noqa: BLE001
            out["nvidia_smi"] = _err(e)
    else:
        out["nvidia_smi"] = None
        out["driver"] = None
    floors = {"torch": "2.13", "triton": "3.7"}
    out["below_declared_floors"] = [
        k
        for k, f in floors.items()
        if out[k]
        and tuple(int(x) for x in out[k].split("+")[0].split(".")[:2]) < tuple(int(x) for x in f.split("."))
    ]
    out["line"] = (
        f"{out['device']}, driver {out['driver']}, python {out['python']}, torch {out['torch']} "
        f"(cuda {out['torch_cuda']}), triton {out['triton']}, transformers {out['transformers']}"
    )
    print(out["line"], flush=True)
    _write(args.out, out)
    return 0


# -- timing and syncs -----------------------------------------------------------------------------
def _timer(device: str) -> Callable[[Callable[[], Any], int, int], list[float]]:
    """``time(fn, warmup, reps)`` -> seconds per call, one per rep (CUDA events on the GPU)."""
    import torch

    def run(fn: Callable[[], Any], warmup: int, reps: int) -> list[float]:
        for _ in range(warmup):
            fn()
        out = []
        if device == "cuda":
            torch.cuda.synchronize()
            evs = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(reps)
            ]
            for a, b in evs:
                a.record()
                fn()
                b.record()
            torch.cuda.synchronize()
            out = [a.elapsed_time(b) / 1e3 for a, b in evs]
        else:
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
        return out

    return run


def count_syncs(fn: Callable[[], Any], device: str) -> dict:
    """Host synchronisations of one call of ``fn``: torch's sync-debug warnings (CUDA only, else
    None) and the CUDA runtime's synchronising calls in a profiler trace (0 on the CPU)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {"sync_debug_warnings": None}
    if device == "cuda":
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        msgs = [str(w.message) for w in caught if "synchronizing CUDA operation" in str(w.message)]
        out["sync_debug_warnings"] = len(msgs)
        if msgs:
            out["first_sync_warning"] = msgs[0].splitlines()[0][:200]
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    # the final synchronize above is ours: one cudaDeviceSynchronize not counted
    calls = {k: names.count(k) for k in SYNC_CALLS}
    if device == "cuda":
        calls["cudaDeviceSynchronize"] = max(0, calls["cudaDeviceSynchronize"] - 1)
    out["profiler_sync_calls"] = sum(calls.values())
    out["profiler_sync_calls_by_name"] = calls
    return out


# -- kernel ---------------------------------------------------------------------------------------
def _plant(n: int) -> dict[str, list[int]]:
    """Where NaN (3), +inf (2) and -inf (4) go in a tensor of ``n`` elements: spread out, distinct."""
    spots = sorted(
        {max(0, min(n - 1, int(n * f))) for f in (0.013, 0.21, 0.37, 0.44, 0.58, 0.66, 0.79, 0.88, 0.999)}
    )
    if len(spots) < 9:
        raise ValueError(f"--mib too small: {n} elements")
    return {
        "nan": [spots[0], spots[4], spots[8]],
        "posinf": [spots[1], spots[6]],
        "neginf": [spots[2], spots[3], spots[5], spots[7]],
    }


def cmd_kernel(args) -> int:
    import torch

    from nan_hunter.kernels import triton as tk
    from nan_hunter.kernels.reference import full_row
    from nan_hunter.kernels.stats import FLOAT_FIELDS, INT_FIELDS, N_FLOAT, N_INT

    dev = args.device
    timed = _timer(dev)
    n_bytes = int(args.mib * 2**20) // 16 * 16
    res: dict[str, Any] = {
        "device": dev,
        "bytes": n_bytes,
        "target_fraction_of_copy": KERNEL_TARGET,
        "reps": args.reps,
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        "block_size": tk.BLOCK_SIZE,
        "num_warps": tk.NUM_WARPS,
        "max_programs": tk.MAX_PROGRAMS,
    }
    src = torch.randn(n_bytes // 4, device=dev)
    dst = torch.empty_like(src)
    t = timed(lambda s=src, d=dst: d.copy_(s), args.warmup, args.reps)
    copy_s = statistics.median(t)
    res["copy"] = {"median_ms": copy_s * 1e3, "GBps_read_plus_written": 2 * n_bytes / copy_s / 1e9}
    copy_gbps = res["copy"]["GBps_read_plus_written"]
    print(f"copy: {copy_s * 1e3:.3f} ms, {copy_gbps:.4g} GB/s (read + written)", flush=True)
    del src, dst
    rows, ok_all = [], True
    for dtype in (torch.float32, torch.bfloat16):
        n = n_bytes // (torch.finfo(dtype).bits // 8)
        plant = _plant(n)
        x = torch.randn(n, device=dev, dtype=dtype)
        for kind, value in (("nan", float("nan")), ("posinf", float("inf")), ("neginf", float("-inf"))):
            x[torch.tensor(plant[kind], device=dev)] = value
        want_i, want_f = (v.cpu() for v in full_row(x))
        ints = torch.zeros(2, N_INT, dtype=torch.int64, device=dev)
        floats = torch.zeros(2, N_FLOAT, dtype=torch.float32, device=dev)
        name = str(dtype).removeprefix("torch.")
        for launcher in ("stats_into", "stats_many_into"):

            def fn(x=x, launcher=launcher, ints=ints, floats=floats):
                if launcher == "stats_into":
                    tk.stats_into(x, ints, floats, 0)
                else:
                    tk.stats_many_into([x], ints, floats, [1])

            row = 0 if launcher == "stats_into" else 1
            row_err = None
            try:
                fn()
                if dev == "cuda":
                    torch.cuda.synchronize()
                got_i, got_f = ints[row].cpu(), floats[row].cpu()
                gi = dict(zip(INT_FIELDS, got_i.tolist()))
                gf = dict(zip(FLOAT_FIELDS, got_f.tolist()))
                counts = {k: gi[k] for k in ("nan", "posinf", "neginf")}
                planted = {k: len(v) for k, v in plant.items()}
                checks = {
                    "counts_equal_planted": counts == planted,
                    "first_nonfinite_equal_planted": gi["first_nonfinite"]
                    == min(min(v) for v in plant.values()),
                    "ints_equal_reference": bool(torch.equal(got_i, want_i)),
                    "absmax_min_nonzero_equal_reference": gf["absmax"] == want_f[0].item()
                    and gf["min_nonzero"] == want_f[1].item(),
                    "sum_close_to_reference": math.isclose(
                        gf["sum"], want_f[2].item(), rel_tol=1e-3, abs_tol=1e-3 * math.sqrt(n)
                    ),
                }
                t = timed(fn, args.warmup, args.reps)
                s = statistics.median(t)
                gbps = n_bytes / s / 1e9
            except Exception as e:  # noqa: BLE001 - a crash is a result of this stage
                row_err, counts, checks, s, gbps = _err(e), None, {}, None, None
                traceback.print_exc()
            ok = row_err is None and all(checks.values())
            ok_all &= ok
            frac = gbps / copy_gbps if gbps else None
            rows.append(
                {
                    "dtype": name,
                    "launcher": launcher,
                    "numel": n,
                    "planted": plant,
                    "counts": counts,
                    "checks": checks,
                    "correct": ok,
                    "median_ms": s * 1e3 if s else None,
                    "GBps_read": gbps,
                    "fraction_of_copy": frac,
                    "target_met": frac is not None and frac >= KERNEL_TARGET,
                    "error": row_err,
                }
            )
            print(
                f"kernel {name:>8} {launcher:<15} "
                + (f"{s * 1e3:.3f} ms, {gbps:.4g} GB/s = {frac:.3g} of copy, " if s else "")
                + f"correct {ok} {checks} {row_err or ''}",
                flush=True,
            )
        # the naive check's bandwidth on the same tensor, for comparison
        t = timed(lambda x=x: torch.isfinite(x).all(), args.warmup, args.reps)
        res.setdefault("isfinite_all", {})[name] = {
            "median_ms": statistics.median(t) * 1e3,
            "GBps_read": n_bytes / statistics.median(t) / 1e9,
        }
        if args.profile:
            res.setdefault("profile", {})[name] = _profile(
                lambda x=x, i=ints, f=floats: tk.stats_into(x, i, f, 0), dev, args.profile_calls
            )
        del x
        if dev == "cuda":
            torch.cuda.empty_cache()
    res["rows"] = rows
    res["correct"] = ok_all
    default = [r for r in rows if r["launcher"] == "stats_into"]
    res["target_met"] = all(r["target_met"] for r in default)
    _write(args.out, res)
    return 0 if ok_all else 1


def _profile(fn: Callable[[], Any], dev: str, n: int = 5) -> str:
    """The profiler's table for ``n`` calls: device time per kernel, launch gaps, host time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            fn()
        if dev == "cuda":
            torch.cuda.synchronize()
    key = "cuda_time_total" if dev == "cuda" else "cpu_time_total"
    try:
        return prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=60)
    except Exception:  # noqa: BLE001 - older torch names the device column differently
        return prof.key_averages().table(row_limit=12, max_name_column_width=60)


# -- the model ------------------------------------------------------------------------------------
def llama(kind: str, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if kind == "llama1b":  # TinyLlama's shape, as bench/overhead.py --device cuda
        cfg = LlamaConfig(
            vocab_size=32000,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=22,
            num_attention_heads=32,
            num_key_value_heads=4,
            max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        )
    else:
        cfg = LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            tie_word_embeddings=False,
        )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    info = {
        "model": f"LlamaForCausalLM(hidden {cfg.hidden_size}, inter {cfg.intermediate_size}, "
        f"{cfg.num_hidden_layers} layers, {cfg.num_attention_heads} heads, "
        f"{cfg.num_key_value_heads} kv heads, vocab {cfg.vocab_size}), random init, sdpa",
        "params": sum(p.numel() for p in model.parameters()),
    }
    return model, info


def _inputs(vocab: int, batch: int, seq: int, device: str, labels: bool = False) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, seq), generator=g).to(device)
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if labels:
        out["labels"] = ids
    return out


def _rounds(variants: dict[str, dict], rounds: int, iters: int, sync: Callable[[], None]) -> None:
    """Interleaved rounds (the order rotates): per variant, the mean seconds per call of each round."""
    live = [k for k, v in variants.items() if v["error"] is None]
    for r in range(rounds):
        for k in live[r % len(live) :] + live[: r % len(live)]:
            v = variants[k]
            with v["session"]():
                sync()
                t0 = time.perf_counter()
                for _ in range(iters):
                    v["step"]()
                sync()
                v["times"].append((time.perf_counter() - t0) / iters)
        print(
            f"round {r + 1}/{rounds}: "
            + ", ".join(f"{k} {variants[k]['times'][-1] * 1e3:.1f}ms" for k in live),
            flush=True,
        )


def _rows(variants: dict[str, dict]) -> dict:
    base = statistics.median(variants["plain"]["times"]) if variants["plain"]["times"] else None
    out = {}
    for k, v in variants.items():
        m = statistics.median(v["times"]) if v["times"] else None
        out[k] = {
            "describe": v["describe"],
            "median_ms": m * 1e3 if m else None,
            "rounds_ms": [t * 1e3 for t in v["times"]],
            "ratio_to_plain": m / base if m and base else None,
            "error": v["error"],
            **v["extra"],
        }
    return out


def _sync_fn(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


# -- forward --------------------------------------------------------------------------------------
def cmd_forward(args) -> int:
    import torch
    from overhead import duo_session, naive_session

    import nan_hunter

    dev = args.device
    sync = _sync_fn(dev)
    torch.set_num_threads(args.threads)
    model, info = llama(args.model, dev)
    model = model.to(torch.bfloat16).eval()
    inputs = _inputs(model.config.vocab_size, args.batch, args.seq, dev)
    info.update(dtype="bfloat16", batch=[args.batch, args.seq], grad="torch.no_grad()")

    def fwd():
        return model(**inputs)

    def fresh(level: str | None):
        kw = {} if level is None else {"level": level}

        def step():
            with nan_hunter.watch(model, **kw):
                return fwd()

        return step

    V = dict  # noqa: N806
    variants = {
        "plain": V(describe="model(**inputs)", step=fwd, session=contextlib.nullcontext),
        "watch_default": V(
            describe="fresh `with nan_hunter.watch(model)` per forward (default level: blocks)",
            step=fresh(None),
            session=contextlib.nullcontext,
        ),
        "watch_modules": V(
            describe="fresh `with nan_hunter.watch(model, level='modules')` per forward",
            step=fresh("modules"),
            session=contextlib.nullcontext,
        ),
        "duo": V(
            describe="transformers DebugUnderflowOverflow(model), hooks once per round",
            step=fwd,
            session=lambda: duo_session(model),
        ),
        "naive": V(
            describe="forward hooks: torch.isfinite(out).all().item() per float output",
            step=fwd,
            session=lambda: naive_session(model),
        ),
    }
    for v in variants.values():
        v.update(times=[], error=None, extra={})
    t0 = time.perf_counter()
    with torch.no_grad():
        ref = fwd().logits.clone()
        info["plain_deterministic"] = bool(torch.equal(ref, fwd().logits))
        for k, v in variants.items():
            try:
                with v["session"]():
                    for _ in range(args.warmup):
                        out = v["step"]()
                    v["extra"]["bitwise_equal_to_plain"] = bool(torch.equal(ref, out.logits))
                    v["extra"]["host_syncs_per_forward"] = count_syncs(v["step"], dev)
            except Exception as e:  # noqa: BLE001 - a peer crashing is a result
                v["error"] = _err(e)
                v["extra"]["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
                print(f"{k}: {v['error']}", flush=True)
        for k, level in (("watch_default", None), ("watch_modules", "modules")):
            if variants[k]["error"] is not None:
                continue
            held: dict = {}

            def fwd_report(level=level, held=held):
                with nan_hunter.watch(model, **({} if level is None else {"level": level})) as w:
                    fwd()
                held["clean"] = w.report().first_nonfinite is None
                held["bytes_read"] = getattr(getattr(w, "sink", None), "bytes_read", None)

            try:
                variants[k]["extra"]["host_syncs_forward_and_report"] = count_syncs(fwd_report, dev)
                variants[k]["extra"]["report_clean"] = held.get("clean")
                variants[k]["extra"]["bytes_read_per_forward"] = held.get("bytes_read")
            except Exception as e:  # noqa: BLE001
                variants[k]["error"] = f"report: {_err(e)}"
                variants[k]["extra"]["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
        check_s = time.perf_counter() - t0
        _rounds(variants, args.rounds, args.iters, sync)
    res = {
        "device": dev,
        "workload": info,
        "rounds": args.rounds,
        "iters": args.iters,
        "warmup": args.warmup,
        "check_s": check_s,
        "variants": _rows(variants),
        "peak_mem_GB": torch.cuda.max_memory_allocated() / 1e9 if dev == "cuda" else None,
    }
    _print_rows(res)
    _write(args.out, res)
    return 0 if all(variants[k]["error"] is None for k in ("plain", "watch_default", "watch_modules")) else 1


def _print_rows(res: dict) -> None:
    print(f"{'variant':<16} {'median ms':>10} {'x plain':>8} {'syncs':>6} {'prof':>5}  equal  error")
    for k, r in res["variants"].items():
        s = r.get("host_syncs_per_forward") or r.get("host_syncs_per_step") or {}
        m = f"{r['median_ms']:.2f}" if r["median_ms"] else "-"
        x = f"{r['ratio_to_plain']:.3f}" if r["ratio_to_plain"] else "-"
        print(
            f"{k:<16} {m:>10} {x:>8} {s.get('sync_debug_warnings')!s:>6} {s.get('profiler_sync_calls')!s:>5}  "
            f"{r.get('bitwise_equal_to_plain')!s:<6} {r['error'] or ''}",
            flush=True,
        )


# -- train ----------------------------------------------------------------------------------------
def cmd_train(args) -> int:
    import torch
    from overhead import duo_session
    from train_overhead import naive_session

    import nan_hunter

    dev = args.device
    sync = _sync_fn(dev)
    torch.set_num_threads(args.threads)
    model, info = llama(args.model, dev)
    model = model.float().train()
    batch = _inputs(model.config.vocab_size, args.batch, args.seq, dev, labels=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.bfloat16 if dev == "cuda" else None
    info.update(
        dtype="float32 weights" + (", bf16 autocast" if autocast else ""),
        batch=[args.batch, args.seq],
        optimizer="torch.optim.AdamW(lr=1e-4)",
        loss="the model's own (labels = input_ids)",
    )

    def step():
        with torch.autocast(dev, dtype=autocast, enabled=autocast is not None):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    watches: dict[str, Any] = {}

    def watched(level: str | None):
        kw = {} if level is None else {"level": level}

        def session():  # one watch for the whole run, attached for each round (`with w:`)
            key = level or "default"
            if key not in watches:
                watches[key] = nan_hunter.watch(model, backward=True, optimizer=opt, **kw)
            return watches[key]

        return session

    V = dict  # noqa: N806
    variants = {
        "plain": V(describe="forward, loss, backward, AdamW step, zero_grad", session=contextlib.nullcontext),
        "watch_default": V(
            describe="one nan_hunter.watch(model, backward=True, optimizer=opt) for the run "
            "(default level: blocks)",
            session=watched(None),
        ),
        "watch_modules": V(describe="the same at level='modules'", session=watched("modules")),
        "duo": V(
            describe="transformers DebugUnderflowOverflow(model), hooks once per round",
            session=lambda: duo_session(model),
        ),
        "naive": V(
            describe="isfinite().all().item() hooks: module outputs, their grads, parameter grads",
            session=lambda: naive_session(model),
        ),
    }
    for v in variants.values():
        v.update(step=step, times=[], error=None, extra={})
    t0 = time.perf_counter()
    for k, v in variants.items():
        try:
            with v["session"]():
                for _ in range(args.warmup):
                    loss = step()
                v["extra"]["loss_finite"] = bool(torch.isfinite(loss).item())
                v["extra"]["host_syncs_per_step"] = count_syncs(step, dev)
        except Exception as e:  # noqa: BLE001
            v["error"] = _err(e)
            v["extra"]["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
            print(f"{k}: {v['error']}", flush=True)
    check_s = time.perf_counter() - t0
    _rounds(variants, args.rounds, args.iters, sync)
    for key, w in watches.items():
        name = f"watch_{key}"
        try:
            r = w.report()
            variants[name]["extra"]["report_clean"] = r.first_nonfinite is None
            variants[name]["extra"]["report_n_forwards"] = getattr(r, "n_forwards", None)
        except Exception as e:  # noqa: BLE001
            variants[name]["error"] = f"report: {_err(e)}"
    res = {
        "device": dev,
        "workload": info,
        "rounds": args.rounds,
        "steps": args.iters,
        "warmup": args.warmup,
        "check_s": check_s,
        "variants": _rows(variants),
        "peak_mem_GB": torch.cuda.max_memory_allocated() / 1e9 if dev == "cuda" else None,
    }
    _print_rows(res)
    _write(args.out, res)
    return 0 if all(variants[k]["error"] is None for k in ("plain", "watch_default", "watch_modules")) else 1


# -- compare --------------------------------------------------------------------------------------
COMPARED = (
    "exit_code",
    "weights.nonfinite",
    "first_nonfinite.input_index",
    "first_nonfinite.module",
    "first_nonfinite.op",
    "first_nonfinite.kind",
    "first_nonfinite.tensor",
    "first_nonfinite.step",
    "first_nonfinite.position",
    "diagnosis.cause",
    "diagnosis.dtype",
    "diagnosis.module",
    "diagnosis.op",
)


def _pick(d: Any, path: str) -> Any:
    for k in path.split("."):
        d = d.get(k) if isinstance(d, dict) else None
    return d


def cmd_compare(args) -> int:
    """``scan_<tag>_<a>.json`` against ``scan_<tag>_<b>.json`` in ``--dir``, field by field, with
    the exit codes from ``scan_rc.tsv`` (tag, side, exit code)."""
    w = Path(args.dir)
    rows, same = [], True
    codes: dict[tuple[str, str], int] = {}
    if (w / "scan_rc.tsv").exists():
        for line in (w / "scan_rc.tsv").read_text().splitlines():
            tag, side, rc = (line.split("\t") + ["", "", ""])[:3]
            codes[(tag, side)] = int(rc) if rc.lstrip("-").isdigit() else rc
    for a in sorted(w.glob(f"scan_*_{args.a}.json")):
        tag = a.name.removeprefix("scan_").removesuffix(f"_{args.a}.json")
        b = w / f"scan_{tag}_{args.b}.json"
        row: dict[str, Any] = {"example": tag}
        try:
            ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
            ja["exit_code"], jb["exit_code"] = codes.get((tag, args.a)), codes.get((tag, args.b))
        except Exception as e:  # noqa: BLE001
            row["error"] = _err(e)
            same = False
            rows.append(row)
            continue
        row["fields"] = {
            p: {args.a: _pick(ja, p), args.b: _pick(jb, p), "same": _pick(ja, p) == _pick(jb, p)}
            for p in COMPARED
        }
        row["same"] = all(f["same"] for f in row["fields"].values())
        same &= row["same"]
        rows.append(row)
        diff = [p for p, f in row["fields"].items() if not f["same"]]
        print(
            f"{tag:<28} {'same' if row['same'] else 'DIFF ' + ', '.join(diff)}  exit "
            f"{row['fields']['exit_code'][args.a]}/{row['fields']['exit_code'][args.b]}, cause "
            f"{row['fields']['diagnosis.cause'][args.a]!r}",
            flush=True,
        )
    _write(args.out, {"a": args.a, "b": args.b, "examples": rows, "all_same": same and bool(rows)})
    return 0 if same and rows else 1


# -- summary --------------------------------------------------------------------------------------
def _load(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except Exception:  # noqa: BLE001
        return None


def _junit(p: Path) -> dict | None:
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(p).getroot()
    except Exception:  # noqa: BLE001
        return None
    suites = [root] if root.tag == "testsuite" else list(root)
    tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    tot["failed_names"] = [
        f"{c.get('classname')}::{c.get('name')}"
        for s in suites
        for c in s.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ][:30]
    return tot


def cmd_summary(args) -> int:
    w = Path(args.dir)
    stages = []
    table = w / "stages.tsv"
    if table.exists():
        for line in table.read_text().splitlines():
            name, rc, secs, budget = (line.split("\t") + ["", "", "", ""])[:4]
            stages.append(
                {
                    "stage": name,
                    "rc": int(rc) if rc.lstrip("-").isdigit() else rc,
                    "seconds": int(secs) if secs.isdigit() else secs,
                    "budget_s": int(budget) if budget.isdigit() else budget,
                    "timed_out": rc in ("124", "137"),
                    "skipped": rc == "skip",
                }
            )
    res: dict[str, Any] = {
        "mode": args.mode,
        "total_s": args.total_s,
        "stages": stages,
        "env": _load(w / "env.json"),
        "kernel": _load(w / "kernel.json"),
        "forward": _load(w / "forward.json"),
        "train": _load(w / "train.json"),
        "scan_compare": _load(w / "scan_compare.json"),
        "trace_diff": _load(w / "trace_diff.json"),
        "tests": {p.stem.removeprefix("junit_"): _junit(p) for p in sorted(w.glob("junit_*.xml"))},
    }
    for k in ("forward", "train"):  # the variant tables, without the per-round lists
        if isinstance(res[k], dict):
            for r in res[k].get("variants", {}).values():
                r.pop("rounds_ms", None)
    td = res["trace_diff"]
    if isinstance(td, dict):  # the verdict, without the two environments in full
        res["trace_diff"] = {k: v for k, v in td.items() if k not in ("a", "b")}
        res["trace_diff"]["devices"] = [(td.get(s) or {}).get("env", {}).get("device") for s in ("a", "b")]
    res["targets"] = _targets(res)
    Path(args.out_json).write_text(json.dumps(res, indent=2, default=str))
    Path(args.out_md).write_text(_markdown(res))
    print(Path(args.out_md).read_text(), flush=True)
    return 0


def _targets(res: dict) -> dict:
    t: dict[str, Any] = {}
    k = res.get("kernel")
    if isinstance(k, dict):
        t["kernel_ge_0.70_of_copy"] = {
            r["dtype"]: r["fraction_of_copy"] for r in k.get("rows", []) if r["launcher"] == "stats_into"
        }
        t["kernel_ge_0.70_of_copy_met"] = k.get("target_met")
        t["kernel_counts_correct"] = k.get("correct")
    for name, key in (("forward", "host_syncs_forward_and_report"), ("train", "host_syncs_per_step")):
        f = res.get(name)
        if isinstance(f, dict):
            v = f.get("variants", {})
            t[f"{name}_ratio_to_plain"] = {n: r.get("ratio_to_plain") for n, r in v.items()}
            t[f"{name}_watch_syncs"] = {
                n: (r.get(key) or r.get("host_syncs_per_step") or {}).get("sync_debug_warnings")
                for n, r in v.items()
                if n.startswith("watch_")
            }
    sc = res.get("scan_compare")
    if isinstance(sc, dict):
        t["scan_same_on_both_devices"] = sc.get("all_same")
    return t


def _fmt(x: Any, spec: str = ".3f") -> str:
    if isinstance(x, float):
        return format(x, spec)
    return str(x if x is not None else "-")


def _markdown(res: dict) -> str:
    env = res.get("env") or {}
    L = [
        f"# gpu_truth ({res['mode']}), {_fmt(res['total_s'], 'd')} s",
        "",
        f"Environment: {env.get('line', '-')}",
        f"nan_hunter from the checkout: {env.get('nan_hunter_from_checkout')}; below the declared floors: "
        f"{env.get('below_declared_floors')}",
        "",
        "| stage | rc | s | budget s |",
        "| --- | --- | --- | --- |",
    ]
    L += [
        f"| {s['stage']} | {s['rc']}{' (timed out)' if s['timed_out'] else ''} | {s['seconds']} | {s['budget_s']} |"
        for s in res["stages"]
    ]
    k = res.get("kernel")
    if isinstance(k, dict):
        c = k.get("copy", {})
        L += [
            "",
            f"Kernel on {k['bytes'] / 2**20:.4g} MiB; copy {_fmt(c.get('GBps_read_plus_written'), '.4g')} GB/s "
            f"(read + written); target >= {KERNEL_TARGET:.2f} of copy",
            "",
            "| dtype | launcher | ms | GB/s read | x copy | NaN/+inf/-inf | correct |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in k.get("rows", []):
            cn = r.get("counts") or {}
            L.append(
                f"| {r['dtype']} | {r['launcher']} | {_fmt(r['median_ms'])} | {_fmt(r['GBps_read'], '.4g')} | "
                f"{_fmt(r['fraction_of_copy'], '.2f')} | {cn.get('nan')}/{cn.get('posinf')}/{cn.get('neginf')} | "
                f"{r['correct']}{' ' + r['error'] if r.get('error') else ''} |"
            )
    for name, key in (("forward", "host_syncs_per_forward"), ("train", "host_syncs_per_step")):
        f = res.get(name)
        if not isinstance(f, dict):
            continue
        wl = f.get("workload", {})
        L += [
            "",
            f"{name}: {wl.get('model')}, {wl.get('dtype')}, batch {wl.get('batch')}, "
            f"{_fmt(wl.get('params', 0) / 1e9, '.3g')}B params",
            "",
            "| variant | median ms | x plain | syncs (debug) | syncs (profiler) | syncs with report | equal | error |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for n, r in f.get("variants", {}).items():
            s = r.get(key) or {}
            sr = r.get("host_syncs_forward_and_report") or {}
            L.append(
                f"| {n} | {_fmt(r.get('median_ms'), '.2f')} | {_fmt(r.get('ratio_to_plain'))} | "
                f"{_fmt(s.get('sync_debug_warnings'))} | {_fmt(s.get('profiler_sync_calls'))} | "
                f"{_fmt(sr.get('sync_debug_warnings'))} | {_fmt(r.get('bitwise_equal_to_plain'))} | {r.get('error') or ''} |"
            )
    sc = res.get("scan_compare")
    if isinstance(sc, dict):
        L += ["", f"scan {sc['a']} vs {sc['b']}: all same = {sc.get('all_same')}"]
        for r in sc.get("examples", []):
            f = r.get("fields") or {}
            diff = [p for p, x in f.items() if not x["same"]]
            c, e = f.get("diagnosis.cause", {}), f.get("exit_code", {})
            L.append(
                f"- {r['example']}: {'same' if r.get('same') else 'DIFF ' + ', '.join(diff)} (exit "
                f"{e.get(sc['a'])}/{e.get(sc['b'])}, cause {c.get(sc['a'])!r} / {c.get(sc['b'])!r}, module "
                f"{f.get('first_nonfinite.module', {}).get(sc['a'])!r}) {r.get('error', '')}"
            )
    td = res.get("trace_diff")
    if td is not None:
        L += ["", f"trace diff: {json.dumps(td, default=str)[:600]}"]
    for name, j in (res.get("tests") or {}).items():
        if j:
            L.append(
                f"- pytest {name}: {j['tests']} tests, {j['failures']} failed, {j['errors']} errors, "
                f"{j['skipped']} skipped {j['failed_names'][:10] if j['failed_names'] else ''}"
                + (" (the rehearsal only collects)" if res["mode"] == "cpu" else "")
            )
    L += ["", "targets: " + json.dumps(res.get("targets"), default=str)]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("env")
    p.add_argument("--root", default=str(HERE.parent))
    p.add_argument("--out", required=True)
    p = sub.add_parser("kernel")
    p.add_argument("--device", choices=["cpu", "cuda"], required=True)
    p.add_argument("--mib", type=float, default=1024.0)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument(
        "--profile-calls", type=int, default=5, help="calls in the profile of stats_into per dtype"
    )
    p.add_argument("--out", required=True)
    for name in ("forward", "train"):
        p = sub.add_parser(name)
        p.add_argument("--device", choices=["cpu", "cuda"], required=True)
        p.add_argument("--model", choices=["llama1b", "tiny"], default="llama1b")
        p.add_argument("--batch", type=int, default=4)
        p.add_argument("--seq", type=int, default=512)
        p.add_argument("--rounds", type=int, default=5)
        p.add_argument("--iters", type=int, default=5, help="timed calls per variant per round")
        p.add_argument("--warmup", type=int, default=2)
        p.add_argument("--threads", type=int, default=4)
        p.add_argument("--out", required=True)
    p = sub.add_parser("compare")
    p.add_argument("--dir", required=True)
    p.add_argument("--a", default="cpu")
    p.add_argument("--b", default="cuda")
    p.add_argument("--out", required=True)
    p = sub.add_parser("summary")
    p.add_argument("--dir", required=True)
    p.add_argument("--mode", default="gpu")
    p.add_argument("--total-s", type=int, default=None)
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-md", required=True)
    args = ap.parse_args(argv)
    if getattr(args, "device", None) == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("--device cuda: CUDA is not available here", file=sys.stderr)
            return 2
    return {
        "env": cmd_env,
        "kernel": cmd_kernel,
        "forward": cmd_forward,
        "train": cmd_train,
        "compare": cmd_compare,
        "summary": cmd_summary,
    }[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
