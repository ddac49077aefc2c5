"""Weights-scan throughput and peak memory: ``nanhunter scan`` against the naive approach.

Generates a synthetic Llama-7B-shaped sharded safetensors checkpoint (bf16 and fp32 tensors,
4096x4096 / 11008x4096 / 4096x11008 / 32000x4096, a few NaN/±Inf planted at known indices),
warms the page cache with one full read of every shard, then measures in fresh child processes:

* ``nanhunter scan CKPT --json out.json -q`` with ``--stats fast`` (default) and ``--stats full``;
* the naive approach: ``safetensors.torch.load_file`` per shard + ``torch.isfinite(t).all()``
  per tensor.

Wall time is measured around the child (raw) and also net of interpreter + torch start-up,
measured the same way (``python -c "import torch, nan_hunter.load.weights"`` for nanhunter,
``python -c "import torch, safetensors.torch"`` for the naive script). Peak RSS comes from
``/usr/bin/time -v`` (or ``getrusage(RUSAGE_CHILDREN)`` in a fresh wrapper when it is absent).
Two checkpoint sizes are measured (``--small-gb``, default half of ``--gb``): the smaller one is
the first shards of the larger one (hard links plus its own index), so peak RSS can be compared
across sizes with the same largest tensor. Both tools must find every planted fault.

    python bench/scan_throughput.py                     # 2 GB and 4 GB, 3 interleaved rounds
    python bench/scan_throughput.py --gb 8 --repeat 1 --keep --dir /data/ckpt
    python bench/scan_throughput.py --whole-process --repeat 7   # only `nanhunter scan` as a process
    python bench/scan_throughput.py --quantized --gb 1.1  # fp8 block, GPTQ, GGUF Q4_K/Q8_0: plain + quantized

``--whole-process`` measures ``python -m nan_hunter scan FILE --json R -q`` as a whole process on
one-file checkpoints of the ``--sizes`` given (GB; default ``--gb``), against its peers
(``python -c pass``, ``import numpy``, the scan's start-up, the CLI on a one-tensor file) and the
in-process scan; with ``--baseline DIR`` the same commands of an older tree run in the same rounds,
the order of the trees alternating. Wall and CPU time (user + system) per command, medians. Both
trees are byte-compiled first (``compileall``), as an installed package is. It reuses checkpoints
already in ``--dir`` (from ``--keep``) instead of writing them again.

    python bench/scan_throughput.py --whole-process --sizes 0.1,1.2 --repeat 5 --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from machine import cpu_name  # bench/machine.py (scripts run as `python bench/NAME.py`)

GB = 1e9
MB = 1e6
HIDDEN, INTER, VOCAB = 4096, 11008, 32000
HERE = Path(__file__).resolve().parent
TIME_BIN = "/usr/bin/time"


# -- checkpoint plan ------------------------------------------------------------------------------
@dataclass
class Spec:
    name: str
    dtype: str  # "bf16" | "fp32"
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * (2 if self.dtype == "bf16" else 4)


def layer_specs(i: int) -> list[Spec]:
    """One Llama-7B-shaped decoder layer; every third layer is kept in fp32, norms always are."""
    dt = "fp32" if i % 3 == 2 else "bf16"
    p = f"model.layers.{i}."
    return [
        Spec(p + "input_layernorm.weight", "fp32", (HIDDEN,)),
        *[Spec(p + f"self_attn.{n}_proj.weight", dt, (HIDDEN, HIDDEN)) for n in "qkvo"],
        Spec(p + "post_attention_layernorm.weight", "fp32", (HIDDEN,)),
        Spec(p + "mlp.gate_proj.weight", dt, (INTER, HIDDEN)),
        Spec(p + "mlp.up_proj.weight", dt, (INTER, HIDDEN)),
        Spec(p + "mlp.down_proj.weight", dt, (HIDDEN, INTER)),
    ]


def plan(total_bytes: float, shard_bytes: float) -> tuple[list[list[Spec]], int]:
    """Tensors grouped into shards (each shard closed once it reaches ``shard_bytes``)."""
    specs = [Spec("model.embed_tokens.weight", "bf16", (VOCAB, HIDDEN))]
    size, i = specs[0].nbytes, 0
    while size < total_bytes:
        for s in layer_specs(i):
            specs.append(s)
            size += s.nbytes
        i += 1
    specs.append(Spec("model.norm.weight", "fp32", (HIDDEN,)))
    shards: list[list[Spec]] = [[]]
    acc = 0
    for s in specs:
        if acc >= shard_bytes:
            shards.append([])
            acc = 0
        shards[-1].append(s)
        acc += s.nbytes
    return shards, i


def faults_for(n_layers: int) -> dict[str, list[tuple[int, float]]]:
    """Planted faults: tensor name → [(flat index, value)]. Spread over early and last layers,
    bf16 and fp32, first/last elements, a norm vector."""
    nan, inf = float("nan"), float("inf")
    last = n_layers - 1
    return {
        "model.layers.0.mlp.down_proj.weight": [(17 * INTER + 4242, nan)],  # bf16
        "model.layers.1.self_attn.q_proj.weight": [(HIDDEN * HIDDEN - 1, inf)],  # bf16, last elem
        "model.layers.2.mlp.up_proj.weight": [(0, -inf), (100 * HIDDEN + 7, nan)],  # fp32, first elem
        f"model.layers.{last}.post_attention_layernorm.weight": [(123, nan)],  # fp32 norm
        f"model.layers.{last}.mlp.gate_proj.weight": [
            (5000 * HIDDEN + 1, inf),
            (5000 * HIDDEN + 2, inf),
            (9000 * HIDDEN, -inf),
        ],
    }


def expected(specs: list[Spec], faults: dict[str, list[tuple[int, float]]]) -> dict[str, dict]:
    """What a correct scan must report for the tensors in ``specs``."""
    import math

    out = {}
    for s in specs:
        if s.name not in faults:
            continue
        fl = faults[s.name]
        first = min(i for i, _ in fl)
        idx, rest = [], first
        for d in reversed(s.shape):
            idx.append(rest % d)
            rest //= d
        out[s.name] = {
            "nan": sum(math.isnan(v) for _, v in fl),
            "posinf": sum(v == math.inf for _, v in fl),
            "neginf": sum(v == -math.inf for _, v in fl),
            "first_index": list(reversed(idx)),
        }
    return out


def write_checkpoint(root: Path, shards: list[list[Spec]], faults: dict, seed: int = 0) -> list[Path]:
    """Write the shards (a minimal safetensors writer: 8-byte header length, JSON header padded
    to 8 bytes, raw little-endian data) and ``model.safetensors.index.json``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    pool = torch.randn(48 * 2**20, generator=g) * 0.02  # 192 MB of N(0, 0.02²) values
    chunk = 16 * 2**20
    n = len(shards)
    paths = []
    weight_map = {}
    for k, specs in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        header: dict = {"__metadata__": {"format": "pt"}}
        off = 0
        for s in specs:
            header[s.name] = {
                "dtype": "BF16" if s.dtype == "bf16" else "F32",
                "shape": list(s.shape),
                "data_offsets": [off, off + s.nbytes],
            }
            off += s.nbytes
            weight_map[s.name] = fname
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        path = root / fname
        with open(path, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            for s in specs:
                tdt = torch.bfloat16 if s.dtype == "bf16" else torch.float32
                plant = faults.get(s.name, [])
                for start in range(0, s.numel, chunk):
                    m = min(chunk, s.numel - start)
                    if len(s.shape) == 1:  # a norm: around 1
                        x = 1.0 + pool[:m] * 5
                    else:
                        o = int(torch.randint(0, pool.numel() - m, (1,), generator=g))
                        x = pool[o : o + m]
                    if x.dtype != tdt or any(start <= fi < start + m for fi, _ in plant):
                        x = x.to(tdt, copy=True)
                    for fi, v in plant:
                        if start <= fi < start + m:
                            x[fi - start] = v
                    f.write(x.view(torch.uint8).numpy().data)
        paths.append(path)
    total = sum(s.nbytes for specs in shards for s in specs)
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    return paths


def link_prefix(src: Path, dst: Path, shards: list[list[Spec]], n: int) -> None:
    """A smaller checkpoint: the first ``n`` shards of ``src`` (hard links) with its own index."""
    dst.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for k in range(n):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        target = dst / fname
        if not target.exists():
            try:
                os.link(src / fname, target)
            except OSError:
                shutil.copyfile(src / fname, target)
        for s in shards[k]:
            weight_map[s.name] = fname
    total = sum(s.nbytes for specs in shards[:n] for s in specs)
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )


def warm(paths: list[Path]) -> dict:
    """Read every byte once so the page cache holds the whole checkpoint."""
    buf = bytearray(64 * 2**20)
    mv = memoryview(buf)
    t0 = time.perf_counter()
    n = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                k = f.readinto(mv)
                if not k:
                    break
                n += k
    dt = time.perf_counter() - t0
    return {
        "method": "full sequential read() of every shard into a 64 MiB buffer",
        "bytes": n,
        "seconds": dt,
        "GBps": n / GB / dt,
    }


# -- measurement ----------------------------------------------------------------------------------
def measure(
    cmd: list[str], env: dict | None = None, ok_codes: tuple[int, ...] = (0,), cwd: str | None = None
) -> dict:
    """Run ``cmd`` in a fresh child; wall seconds (perf_counter around it) and peak RSS in bytes."""
    if os.path.exists(TIME_BIN):
        with tempfile.NamedTemporaryFile("r", suffix=".time", delete=False) as tf:
            tpath = tf.name
        full = [TIME_BIN, "-v", "-o", tpath, *cmd]
        t0 = time.perf_counter()
        res = subprocess.run(full, capture_output=True, text=True, env=env, cwd=cwd)
        wall = time.perf_counter() - t0
        text = Path(tpath).read_text()
        os.unlink(tpath)
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        rss = int(m.group(1)) * 1024 if m else None
        user = re.search(r"User time \(seconds\): ([\d.]+)", text)
        system = re.search(r"System time \(seconds\): ([\d.]+)", text)
        cpu = float(user.group(1)) + float(system.group(1)) if user and system else None
        how = "/usr/bin/time -v"
    else:  # a fresh wrapper child so RUSAGE_CHILDREN covers exactly this command
        wrapper = (
            "import resource, subprocess, sys, json; r = subprocess.run(sys.argv[1:]); "
            "print(json.dumps([r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]), "
            "file=sys.stderr); sys.exit(r.returncode)"
        )
        t0 = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, env=env, cwd=cwd
        )
        wall = time.perf_counter() - t0
        last = res.stderr.strip().splitlines()[-1]
        rss = json.loads(last)[1] * 1024
        cpu = None
        how = "getrusage(RUSAGE_CHILDREN) in a wrapper"
    if res.returncode not in ok_codes:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        )
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "rss": rss,
        "rc": res.returncode,
        "stdout": res.stdout,
        "rss_method": how,
    }


def naive_child(index: str) -> None:
    """The naive approach (run in its own process): load each shard fully, isfinite().all() per tensor."""
    t0 = time.perf_counter()
    import torch
    from safetensors.torch import load_file

    t1 = time.perf_counter()
    idx = Path(index)
    shards = sorted(set(json.loads(idx.read_text())["weight_map"].values()))
    bad = []
    nbytes = 0
    for s in shards:
        sd = load_file(str(idx.parent / s))
        for name, t in sd.items():
            nbytes += t.numel() * t.element_size()
            if not bool(torch.isfinite(t).all()):
                bad.append(name)
        del sd
    t2 = time.perf_counter()
    print(json.dumps({"bad": bad, "bytes": nbytes, "import_s": t1 - t0, "scan_s": t2 - t1}))


def inproc_child(path: str, mode: str, preload_torch: str = "") -> None:
    """``scan_weights`` timed inside the process (no interpreter/torch start-up, no report)."""
    t0 = time.perf_counter()
    if preload_torch:  # a tree whose scan runs on torch: start-up, not scan time (it imports torch lazily)
        import torch  # noqa: F401
    from nan_hunter.load.checkpoint import open_checkpoint
    from nan_hunter.load.weights import scan_weights

    t1 = time.perf_counter()
    c1 = time.process_time()
    ck = open_checkpoint(path)
    ws = scan_weights(ck, exact=mode == "full")
    t2 = time.perf_counter()
    c2 = time.process_time()
    print(
        json.dumps(
            {
                "bad": {
                    t.name: {
                        "nan": t.nan,
                        "posinf": t.posinf,
                        "neginf": t.neginf,
                        "first_index": t.first_index,
                    }
                    for t in ws.nonfinite
                },
                "bytes": ck.nbytes,
                "import_s": t1 - t0,
                "scan_s": t2 - t1,
                "scan_cpu_s": c2 - c1,
            }
        )
    )


def check_nanhunter(report_path: Path, exp: dict) -> tuple[bool, str]:
    rep = json.loads(report_path.read_text())
    got = {t["name"]: t for t in rep["weights"]["nonfinite"]}
    problems = []
    if set(got) != set(exp):
        problems.append(f"flagged {sorted(got)} expected {sorted(exp)}")
    for name, e in exp.items():
        g = got.get(name)
        if g is None:
            continue
        for k in ("nan", "posinf", "neginf", "first_index"):
            if g[k] != e[k]:
                problems.append(f"{name}.{k}: got {g[k]} expected {e[k]}")
    return not problems, "; ".join(problems) or "all planted faults found with exact counts and first index"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=4.0, help="size of the larger checkpoint in GB (1e9 bytes)")
    ap.add_argument(
        "--small-gb",
        type=float,
        default=None,
        help="size of the smaller one (default: half of --gb; 0 to skip)",
    )
    ap.add_argument("--shard-gb", type=float, default=0.5, help="target shard size in GB")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (median wall, max RSS)")
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--out", default=str(HERE / "_out" / "scan_throughput.json"))
    ap.add_argument(
        "--whole-process",
        action="store_true",
        help="only `nanhunter scan` as a whole process vs torch start-up (large checkpoint)",
    )
    ap.add_argument(
        "--sizes",
        default=None,
        metavar="GB,GB",
        help="with --whole-process: one-file checkpoints of these sizes (default: --gb), e.g. 0.1,1.2",
    )
    ap.add_argument(
        "--full-stats",
        action="store_true",
        help="with --whole-process: also time the in-process scan with --stats full",
    )
    ap.add_argument(
        "--baseline",
        default=None,
        metavar="DIR",
        help="with --whole-process: also time `python -m nan_hunter scan` with PYTHONPATH=DIR "
        "(an older tree, e.g. from `git archive`), interleaved",
    )
    ap.add_argument("--_naive", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--quantized",
        action="store_true",
        help="a DeepSeek-V3-style fp8 checkpoint (128x128 weight_scale_inv blocks, --gb of fp8 "
        "weights): the plain pass and the quantized pass (bad blocks, dequantized absmax), "
        "timed in-process after a warm read, with peak RSS",
    )
    ap.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="with --quantized: which checkpoints, interleaved (fp8_block, gptq, gguf_q4k, gguf_q8_0)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="with --quantized: torch threads in the measured child (default: torch's own)",
    )
    ap.add_argument("--_inproc", nargs="+", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_quant", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._quant:
        quant_child(args._quant)
        return 0
    if args.quantized:
        return quantized_mode(args)
    if args._naive:
        naive_child(args._naive)
        return 0
    if args._inproc:
        inproc_child(*args._inproc)
        return 0

    if args.whole_process:
        return whole_process(args)

    import torch

    small_gb = args.gb / 2 if args.small_gb is None else args.small_gb
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="nh_scan_bench_"))
    base.mkdir(parents=True, exist_ok=True)
    big_dir = base / "big"
    big_dir.mkdir(exist_ok=True)
    t_all = time.perf_counter()
    shards, n_layers = plan(args.gb * GB, args.shard_gb * GB)
    faults = faults_for(n_layers)
    t0 = time.perf_counter()
    write_checkpoint(big_dir, shards, faults)
    gen_s = time.perf_counter() - t0
    print(
        f"generated {sum(s.nbytes for sh in shards for s in sh) / GB:.2f} GB in {len(shards)} shards "
        f"({n_layers} layers) under {big_dir} in {gen_s:.1f}s",
        flush=True,
    )

    sizes: list[tuple[str, Path, list[list[Spec]]]] = []
    if small_gb > 0:
        acc, n_small = 0, 0
        while n_small < len(shards) and acc < small_gb * GB:
            acc += sum(s.nbytes for s in shards[n_small])
            n_small += 1
        if n_small < len(shards):
            small_dir = base / "small"
            link_prefix(big_dir, small_dir, shards, n_small)
            sizes.append(("small", small_dir, shards[:n_small]))
    sizes.append(("large", big_dir, shards))

    # a one-tensor checkpoint: what the whole CLI costs when there is nothing to scan
    tiny = base / "tiny.safetensors"
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [4096], "data_offsets": [0, 16384]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    tiny.write_bytes(len(hdr).to_bytes(8, "little") + hdr + bytes(16384))
    py = sys.executable
    nh = shutil.which("nanhunter") or str(Path(py).parent / "nanhunter")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    results: dict = {"sizes": {}, "rounds": args.repeat}
    for label, d, sh in sizes:
        specs = [s for x in sh for s in x]
        nbytes = sum(s.nbytes for s in specs)
        largest = max(specs, key=lambda s: s.nbytes)
        exp = expected(specs, faults)
        paths = sorted(d.glob("*.safetensors"))
        load0 = os.getloadavg()
        w = warm(paths)
        print(
            f"[{label}] {nbytes / GB:.2f} GB, {len(specs)} tensors in {len(paths)} shards; largest tensor "
            f"{largest.name} {largest.dtype} {list(largest.shape)} = {largest.nbytes / MB:.0f} MB; "
            f"{sum(len(v) for v in exp.values())} faults planted in {len(exp)} tensors",
            flush=True,
        )
        print(
            f"[{label}] page cache warmed: read {w['bytes'] / GB:.2f} GB in {w['seconds']:.2f}s "
            f"({w['GBps']:.1f} GB/s) just before measuring",
            flush=True,
        )
        report = d / "_report.json"
        runs: dict[str, list[dict]] = {
            k: []
            for k in (
                "startup_nanhunter",
                "startup_naive",
                "version",
                "cli_tiny",
                "nh_fast",
                "nh_full",
                "inproc_fast",
                "naive",
            )
        }
        checks: dict[str, tuple[bool, str]] = {}
        for r in range(args.repeat):
            runs["version"].append(measure([nh, "--version"], env))
            runs["startup_nanhunter"].append(
                measure([py, "-c", "import torch, nan_hunter.load.weights"], env)
            )
            runs["cli_tiny"].append(
                measure([nh, "scan", str(tiny), "--json", str(d / "_tiny.json"), "-q"], env)
            )
            for mode in ("fast", "full"):
                if report.exists():
                    report.unlink()
                m = measure([nh, "scan", str(d), "--json", str(report), "-q", "--stats", mode], env, (0, 1))
                ok, msg = check_nanhunter(report, exp)
                checks[f"nh_{mode}"] = (
                    ok and m["rc"] == (1 if exp else 0) and checks.get(f"nh_{mode}", (True, ""))[0],
                    msg + f" (exit code {m['rc']})",
                )
                runs[f"nh_{mode}"].append(m)
            m = measure([py, str(Path(__file__).resolve()), "--_inproc", str(d), "fast"], env)
            child = json.loads(m["stdout"].strip().splitlines()[-1])
            m["child"] = child
            got = {k: v for k, v in child["bad"].items()}
            checks["inproc_fast"] = (
                got == exp and checks.get("inproc_fast", (True, ""))[0],
                "all planted faults found with exact counts and first index" if got == exp else f"got {got}",
            )
            runs["inproc_fast"].append(m)
            runs["startup_naive"].append(measure([py, "-c", "import torch, safetensors.torch"], env))
            m = measure(
                [py, str(Path(__file__).resolve()), "--_naive", str(d / "model.safetensors.index.json")], env
            )
            child = json.loads(m["stdout"].strip().splitlines()[-1])
            m["child"] = child
            ok = set(child["bad"]) == set(exp)
            checks["naive"] = (
                ok and checks.get("naive", (True, ""))[0],
                f"flagged {sorted(child['bad'])}"
                if not ok
                else "all planted tensors flagged (tensor-level only: no counts or index)",
            )
            runs["naive"].append(m)
            print(
                f"[{label}] round {r + 1}/{args.repeat}: "
                + ", ".join(f"{k} {v[-1]['wall_s']:.2f}s" for k, v in runs.items()),
                flush=True,
            )
        for f in (report, d / "_tiny.json"):
            if f.exists():
                f.unlink()

        def med(k: str, runs: dict = runs) -> float:
            return statistics.median(x["wall_s"] for x in runs[k])

        def peak(k: str, runs: dict = runs) -> int:
            return max(x["rss"] for x in runs[k])

        rows = {}
        for key, startup in (
            ("nh_fast", "startup_nanhunter"),
            ("nh_full", "startup_nanhunter"),
            ("naive", "startup_naive"),
        ):
            raw = med(key)
            net = raw - med(startup)
            rows[key] = {
                "raw_s": raw,
                "net_s": net,
                "GBps_raw": nbytes / GB / raw,
                "GBps_net": nbytes / GB / net if net > 0 else None,
                "peak_rss_MB": peak(key) / MB,
                "found_all_faults": checks[key][0],
                "check": checks[key][1],
                "all_raw_s": [x["wall_s"] for x in runs[key]],
            }
            if key != "naive":  # net of the whole CLI's fixed cost (a one-tensor checkpoint)
                net_cli = raw - med("cli_tiny")
                rows[key]["net_of_cli_tiny_s"] = net_cli
                rows[key]["GBps_net_of_cli_tiny"] = nbytes / GB / net_cli if net_cli > 0 else None
        for key in ("naive", "inproc_fast"):
            if key == "inproc_fast":
                raw = med(key)
                rows[key] = {
                    "raw_s": raw,
                    "net_s": raw - med("startup_nanhunter"),
                    "GBps_raw": nbytes / GB / raw,
                    "GBps_net": None,
                    "peak_rss_MB": peak(key) / MB,
                    "found_all_faults": checks[key][0],
                    "check": checks[key][1],
                    "all_raw_s": [x["wall_s"] for x in runs[key]],
                }
                rows[key]["GBps_net"] = nbytes / GB / rows[key]["net_s"] if rows[key]["net_s"] > 0 else None
            rows[key]["in_process_scan_s"] = statistics.median(x["child"]["scan_s"] for x in runs[key])
            rows[key]["GBps_in_process"] = nbytes / GB / rows[key]["in_process_scan_s"]
        res = {
            "loadavg_before": load0,
            "loadavg_after": os.getloadavg(),
            "bytes": nbytes,
            "GB": nbytes / GB,
            "n_tensors": len(specs),
            "n_shards": len(paths),
            "largest_tensor": {
                "name": largest.name,
                "dtype": largest.dtype,
                "shape": list(largest.shape),
                "MB": largest.nbytes / MB,
            },
            "planted": exp,
            "warm_cache": w,
            "startup": {
                "nanhunter_import_s": med("startup_nanhunter"),
                "nanhunter_import_rss_MB": peak("startup_nanhunter") / MB,
                "naive_import_s": med("startup_naive"),
                "naive_import_rss_MB": peak("startup_naive") / MB,
                "nanhunter_version_s": med("version"),
                "nanhunter_scan_tiny_s": med("cli_tiny"),
                "nanhunter_scan_tiny_rss_MB": peak("cli_tiny") / MB,
                "commands": {
                    "nanhunter": f"{py} -c 'import torch, nan_hunter.load.weights'",
                    "naive": f"{py} -c 'import torch, safetensors.torch'",
                },
            },
            "results": rows,
            "ratios": {
                "fast_vs_naive_GBps_net": rows["nh_fast"]["GBps_net"] / rows["naive"]["GBps_net"],
                "full_vs_naive_GBps_net": rows["nh_full"]["GBps_net"] / rows["naive"]["GBps_net"],
                "fast_vs_naive_GBps_raw": rows["nh_fast"]["GBps_raw"] / rows["naive"]["GBps_raw"],
                "inproc_fast_vs_naive_GBps_in_process": rows["inproc_fast"]["GBps_in_process"]
                / rows["naive"]["GBps_in_process"],
                "fast_vs_naive_rss": rows["nh_fast"]["peak_rss_MB"] / rows["naive"]["peak_rss_MB"],
                "full_vs_naive_rss": rows["nh_full"]["peak_rss_MB"] / rows["naive"]["peak_rss_MB"],
            },
            "rss_limit_MB": largest.nbytes / MB + 300,
            "rss_method": runs["nh_fast"][0]["rss_method"],
        }
        results["sizes"][label] = res

    # targets
    large = results["sizes"]["large"]
    small = results["sizes"].get("small")
    fast = large["results"]["nh_fast"]
    tg: dict = {
        "scan_fast_ge_10GBps_net": fast["GBps_net"] is not None and fast["GBps_net"] >= 10,
        "fast_rss_le_largest_plus_300MB": all(
            s["results"]["nh_fast"]["peak_rss_MB"] <= s["rss_limit_MB"] for s in results["sizes"].values()
        ),
        "full_rss_le_largest_plus_300MB": all(
            s["results"]["nh_full"]["peak_rss_MB"] <= s["rss_limit_MB"] for s in results["sizes"].values()
        ),
        "all_faults_found": all(
            r["found_all_faults"] for s in results["sizes"].values() for r in s["results"].values()
        ),
    }
    if small:
        # marginal throughput: the extra bytes of the larger checkpoint over the extra time (fixed costs cancel)
        extra = large["bytes"] - small["bytes"]
        results["marginal_GBps_small_to_large"] = {
            k: (
                extra / GB / (large["results"][k]["raw_s"] - small["results"][k]["raw_s"])
                if large["results"][k]["raw_s"] > small["results"][k]["raw_s"]
                else None
            )
            for k in large["results"]
        }
        for mode in ("nh_fast", "nh_full"):
            growth = large["results"][mode]["peak_rss_MB"] - small["results"][mode]["peak_rss_MB"]
            tg[f"{mode}_rss_growth_MB_small_to_large"] = growth
            # "not growing": less than 5% of the added checkpoint bytes show up in RSS
            tg[f"{mode}_rss_not_growing"] = growth <= 0.05 * (large["bytes"] - small["bytes"]) / MB
    results["targets"] = tg
    results["machine"] = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "ram_GB": _ram() / GB,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "safetensors": _version("safetensors"),
        "nanhunter": _version("nan-hunter"),
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    results["generation_s"] = gen_s
    results["dir"] = str(base)
    results["total_s"] = time.perf_counter() - t_all
    results["command"] = " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])

    print_table(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    if args.keep:
        print(f"kept {base}")
    else:
        shutil.rmtree(base / "small", ignore_errors=True)
        shutil.rmtree(big_dir, ignore_errors=True)
        tiny.unlink(missing_ok=True)
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    return 0 if tg["all_faults_found"] else 1


def whole_plan(total_bytes: float) -> tuple[list[Spec], int]:
    """The tensors of a one-file checkpoint of about ``total_bytes``: the model's tensors in order (the
    embedding left out below its own size) until the total is reached, and the layers they span."""
    specs = (
        [Spec("model.embed_tokens.weight", "bf16", (VOCAB, HIDDEN))]
        if total_bytes >= VOCAB * HIDDEN * 2
        else []
    )
    size, i = sum(s.nbytes for s in specs), 0
    while size < total_bytes * 0.99:
        for s in layer_specs(i):
            if size >= total_bytes * 0.99:
                break
            specs.append(s)
            size += s.nbytes
        i += 1
    return specs, i


#: faults planted besides ``faults_for``'s, in the first projections (present in every size)
SMALL_FAULTS = {
    "model.layers.0.self_attn.q_proj.weight": [(4242, float("nan"))],
    "model.layers.0.self_attn.v_proj.weight": [(HIDDEN * HIDDEN - 1, -float("inf"))],
}


def whole_process(args: argparse.Namespace) -> int:
    """``nanhunter scan FILE`` as a whole process, for each size of ``--sizes``, against its peers:
    ``python -c pass``, ``import numpy``, the scan's own start-up (``import numpy, nan_hunter.load.weights``)
    and the CLI on a one-tensor file; with ``--baseline DIR`` the same commands from an older tree (its
    start-up ``import torch, nan_hunter.load.weights``) in the same rounds, the order of the two trees
    alternating. Wall (``perf_counter`` around the child) and CPU (user + system from ``/usr/bin/time``);
    medians."""
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="nh_scan_bench_"))
    sizes = [float(x) for x in args.sizes.split(",")] if args.sizes else [args.gb]
    py = sys.executable
    root = str(HERE.parent)
    trees = {"after": root}
    if args.baseline:
        trees["before"] = str(Path(args.baseline).resolve())
    env0 = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env0.pop("PYTHONPATH", None)
    envs = {k: dict(env0, PYTHONPATH=v) for k, v in trees.items()}
    for tree in trees.values():  # as installed: no module compiled from source at each start
        subprocess.run([py, "-m", "compileall", "-q", str(Path(tree) / "nan_hunter")], check=True)
    ckpts: dict[float, tuple[Path, dict, int]] = {}
    gen_s = 0.0
    for gb in sizes:
        specs, n_layers = whole_plan(gb * GB)
        faults = {**faults_for(n_layers), **SMALL_FAULTS}
        d = base / f"{gb:g}GB"
        d.mkdir(parents=True, exist_ok=True)
        f = d / "model-00001-of-00001.safetensors"
        nbytes = sum(s.nbytes for s in specs)
        if not (f.exists() and f.stat().st_size > nbytes):
            t0 = time.perf_counter()
            write_checkpoint(d, [specs], faults)
            gen_s += time.perf_counter() - t0
        ckpts[gb] = (f, expected(specs, faults), nbytes)
    tiny = base / "tiny.safetensors"
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [4096], "data_offsets": [0, 16384]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    tiny.write_bytes(len(hdr).to_bytes(8, "little") + hdr + bytes(16384))
    w = warm([c[0] for c in ckpts.values()])
    load0 = os.getloadavg()
    report = base / "_report.json"
    runs: dict[str, list[dict]] = {}

    def timed(key: str, cmd: list[str], env: dict, codes=(0,), cwd: str | None = None) -> dict:
        m = measure(cmd, env, codes, cwd=cwd)
        runs.setdefault(key, []).append({"wall_s": m["wall_s"], "cpu_s": m.get("cpu_s"), "rss": m["rss"]})
        return m

    startup = {
        "after": "import numpy, nan_hunter.load.weights",
        "before": "import torch, nan_hunter.load.weights",
    }
    ok = True
    problems: list[str] = []
    for r in range(args.repeat):
        timed("python -c pass", [py, "-c", "pass"], env0, cwd=str(base))
        timed("import numpy", [py, "-c", "import numpy"], env0, cwd=str(base))
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for tree in order:
            env, cwd = envs[tree], trees[tree]  # `python -m` puts the working directory first on sys.path
            cmd = [py, "-m", "nan_hunter"]
            timed(f"{tree}: start-up ({startup[tree]})", [py, "-c", startup[tree]], env, cwd=cwd)
            timed(
                f"{tree}: scan of a one-tensor file",
                [*cmd, "scan", str(tiny), "--json", str(base / "_t.json"), "-q"],
                env,
                cwd=cwd,
            )
            for gb, (f, exp, _nbytes) in ckpts.items():
                report.unlink(missing_ok=True)
                m = timed(
                    f"{tree}: scan {gb:g} GB",
                    [*cmd, "scan", str(f), "--json", str(report), "-q"],
                    env,
                    (0, 1),
                    cwd,
                )
                good, msg = check_nanhunter(report, exp)
                if not (good and m["rc"] == 1):
                    ok = False
                    problems.append(f"{tree} {gb:g} GB: {msg} (exit {m['rc']})")
                for mode in ("fast", "full") if args.full_stats else ("fast",):
                    c = measure(
                        [
                            py,
                            str(Path(__file__).resolve()),
                            "--_inproc",
                            str(f),
                            mode,
                            "torch" if tree == "before" else "",
                        ],
                        env,
                        cwd=cwd,
                    )
                    got = json.loads(c["stdout"].strip().splitlines()[-1])
                    runs.setdefault(
                        f"{tree}: in-process scan {gb:g} GB" + (" --stats full" if mode == "full" else ""), []
                    ).append({"wall_s": got["scan_s"], "cpu_s": got.get("scan_cpu_s"), "rss": None})
        print(f"round {r + 1}/{args.repeat} done (load {os.getloadavg()[0]:.2f})", flush=True)
    med = {
        k: {
            "wall_s": statistics.median(x["wall_s"] for x in v),
            "cpu_s": statistics.median(x["cpu_s"] for x in v)
            if all(x["cpu_s"] is not None for x in v)
            else None,
            "peak_rss_MB": max(x["rss"] for x in v) / MB if all(x["rss"] for x in v) else None,
        }
        for k, v in runs.items()
    }
    sizes_out = {}
    for gb, (_f, _, nbytes) in ckpts.items():
        row = {"bytes": nbytes, "target_s": 0.3 + nbytes / (10 * GB)}
        for tree in trees:
            scan = med[f"{tree}: scan {gb:g} GB"]
            st = med[f"{tree}: start-up ({startup[tree]})"]
            inproc = med[f"{tree}: in-process scan {gb:g} GB"]["wall_s"]
            inproc_cpu = med[f"{tree}: in-process scan {gb:g} GB"]["cpu_s"]
            row[tree] = {
                "wall_s": scan["wall_s"],
                "cpu_s": scan["cpu_s"],
                "peak_rss_MB": scan["peak_rss_MB"],
                "in_process_s": inproc,
                "in_process_GBps": nbytes / GB / inproc,
                "in_process_cpu_s": inproc_cpu,
                "in_process_GBps_of_cpu": nbytes / GB / inproc_cpu if inproc_cpu else None,
                "net_of_startup_GBps": (
                    nbytes / GB / (scan["wall_s"] - st["wall_s"]) if scan["wall_s"] > st["wall_s"] else None
                ),
            }
        row["target_met"] = row["after"]["wall_s"] <= row["target_s"]
        sizes_out[f"{gb:g}"] = row
    import numpy

    res = {
        "sizes": sizes_out,
        "median": med,
        "all": runs,
        "rounds": args.repeat,
        "trees": trees,
        "generation_s": gen_s,
        "warm_cache": w,
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
        "found_all_faults": ok,
        "problems": problems,
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "ram_GB": _ram() / GB,
            "python": platform.python_version(),
            "numpy": numpy.__version__,
            "torch": _version("torch"),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        },
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    for k, v in med.items():
        cpu = f", CPU {v['cpu_s']:.3f} s" if v["cpu_s"] is not None else ""
        print(f"{k}: {v['wall_s']:.3f} s{cpu}")
    for gb, row in sizes_out.items():
        print(
            f"{gb} GB: after {row['after']['wall_s']:.3f} s (target {row['target_s']:.3f} s: "
            f"{'met' if row['target_met'] else 'NOT met'}), in-process {row['after']['in_process_GBps']:.2f} GB/s"
            + (
                f"; before {row['before']['wall_s']:.3f} s, in-process {row['before']['in_process_GBps']:.2f} GB/s"
                if "before" in row
                else ""
            )
        )
    print(
        f"faults {'ok' if ok else 'MISSED: ' + '; '.join(problems)}; load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    out = Path(args.out).with_name("scan_throughput_whole_process.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    for f in (report, base / "_t.json", tiny):
        f.unlink(missing_ok=True)
    if not args.keep:
        for f, _, _ in ckpts.values():
            shutil.rmtree(f.parent, ignore_errors=True)
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    return 0 if ok else 1


def print_table(results: dict) -> None:
    names = {
        "nh_fast": "nanhunter scan --stats fast",
        "nh_full": "nanhunter scan --stats full",
        "naive": "naive load_file+isfinite",
        "inproc_fast": "scan_weights() fast, child",
    }
    print()
    print(
        f"{'size':>7} {'method':<28} {'raw s':>7} {'net s':>7} {'GB/s raw':>9} {'GB/s net':>9} "
        f"{'peak RSS MB':>12} {'limit MB':>9} faults"
    )
    for s in results["sizes"].values():
        for k, r in s["results"].items():
            gbn = f"{r['GBps_net']:.2f}" if r["GBps_net"] else "n/a"
            print(
                f"{s['GB']:>5.2f}GB {names[k]:<28} {r['raw_s']:>7.2f} {r['net_s']:>7.2f} {r['GBps_raw']:>9.2f} "
                f"{gbn:>9} {r['peak_rss_MB']:>12.0f} {s['rss_limit_MB']:>9.0f} "
                f"{'ok' if r['found_all_faults'] else 'MISSED'}"
            )
        for k in ("inproc_fast", "naive"):
            print(
                f"        {names[k]}: {s['results'][k]['in_process_scan_s']:.2f}s timed inside the process "
                f"= {s['results'][k]['GBps_in_process']:.2f} GB/s"
            )
        r = s["results"]["nh_fast"]
        print(
            f"        nanhunter scan --stats fast net of the CLI's fixed cost (one-tensor checkpoint "
            f"{s['startup']['nanhunter_scan_tiny_s']:.2f}s): {r['net_of_cli_tiny_s']:.2f}s = "
            f"{(r['GBps_net_of_cli_tiny'] or float('nan')):.2f} GB/s"
        )
        print(
            f"        load average before/after: {s['loadavg_before'][0]:.2f} / {s['loadavg_after'][0]:.2f}"
        )
        st = s["startup"]
        print(
            f"        start-up: nanhunter import {st['nanhunter_import_s']:.2f}s "
            f"({st['nanhunter_import_rss_MB']:.0f} MB), naive import {st['naive_import_s']:.2f}s "
            f"({st['naive_import_rss_MB']:.0f} MB), nanhunter --version {st['nanhunter_version_s']:.2f}s"
        )
        ra = s["ratios"]
        print(
            f"        ratios: fast/naive GB/s net {ra['fast_vs_naive_GBps_net']:.2f}x, "
            f"full/naive {ra['full_vs_naive_GBps_net']:.2f}x, RSS fast/naive {ra['fast_vs_naive_rss']:.2f}, "
            f"full/naive {ra['full_vs_naive_rss']:.2f}; in-process fast/naive "
            f"{ra['inproc_fast_vs_naive_GBps_in_process']:.2f}x"
        )
    if "marginal_GBps_small_to_large" in results:
        print(
            "marginal GB/s (extra bytes / extra time, small -> large): "
            + ", ".join(
                f"{names[k]} {v:.2f}" if v else f"{names[k]} n/a"
                for k, v in results["marginal_GBps_small_to_large"].items()
            )
        )
    print("targets:", json.dumps(results["targets"]))


# -- quantized checkpoints (issues 25, 34) ------------------------------------------------------------
QROWS, QCOLS, QBLOCK = 7168, 18432, 128  # DeepSeek-V3's MoE up-projection shape, 128x128 scale blocks
KINDS = ("fp8_block", "gptq", "gguf_q4k", "gguf_q8_0")


def write_quantized(root: Path, total_bytes: float) -> tuple[list[Path], dict]:
    """fp8 e4m3 weights ``[7168, 18432]`` (132 MB each) with fp32 ``weight_scale_inv`` blocks, two
    tensors per shard, an index and a config.json with ``quantization_config``; planted: one NaN
    scale, one zero scale on a block holding data. Returns the shard paths and what was planted."""
    import torch
    from safetensors.torch import save_file

    n = max(1, math.ceil(total_bytes / (QROWS * QCOLS)))
    gen = torch.Generator().manual_seed(0)
    weight_map, shards = {}, []
    planted = {
        "nan": ("model.layers.0.mlp.experts.0.up_proj.weight", [3, 7]),
        "zero": (f"model.layers.{n - 1}.mlp.experts.0.up_proj.weight", [55, 143]),
    }
    for s0 in range(0, n, 2):
        tensors = {}
        for i in range(s0, min(n, s0 + 2)):
            name = f"model.layers.{i}.mlp.experts.0.up_proj.weight"
            b = torch.randint(0, 256, (QROWS, QCOLS), dtype=torch.uint8, generator=gen)
            b[(b & 0x7F) == 0x7F] = 0x7E  # no NaN bytes: the faults are in the scales
            sc = torch.rand(QROWS // QBLOCK, QCOLS // QBLOCK, generator=gen) * 1e-3 + 1e-4
            for kind, (tname, idx) in planted.items():
                if tname == name:
                    sc[idx[0], idx[1]] = math.nan if kind == "nan" else 0.0
            tensors[name] = b.view(torch.float8_e4m3fn)
            tensors[name + "_scale_inv"] = sc
        fname = f"model-{s0 // 2 + 1:05d}.safetensors"
        save_file(tensors, str(root / fname))
        shards.append(root / fname)
        weight_map.update({k: fname for k in tensors})
        del tensors
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(
        json.dumps(
            {
                "model_type": "deepseek_v3",
                "quantization_config": {
                    "quant_method": "fp8",
                    "fmt": "e4m3",
                    "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128],
                },
            }
        )
    )
    return shards, planted


def write_gptq(root: Path, total_bytes: float) -> tuple[list[Path], dict]:
    """4-bit GPTQ (gptq_v2, sym, group 128) ``[8192 in, 8192 out]`` weights: 32 MB of qweight each, random
    codes, fp16 scales; planted: a NaN scale and a zero scale on a group holding data."""
    import torch
    from safetensors.torch import save_file

    n = max(1, math.ceil(total_bytes / (8192 * 8192 // 2)))
    gen = torch.Generator().manual_seed(1)
    planted = {
        "nan": ("model.layers.0.mlp.down_proj.qweight", [3, 7]),
        "zero": (f"model.layers.{n - 1}.mlp.down_proj.qweight", [60, 8000]),
    }
    tensors = {}
    for i in range(n):
        x = f"model.layers.{i}.mlp.down_proj"
        sc = (torch.rand(64, 8192, generator=gen) * 1e-3 + 1e-4).half()
        for kind, (tname, idx) in planted.items():
            if tname == x + ".qweight":
                sc[idx[0], idx[1]] = math.nan if kind == "nan" else 0.0
        tensors[x + ".qweight"] = torch.randint(
            -(2**31), 2**31 - 1, (1024, 8192), dtype=torch.int32, generator=gen
        )
        tensors[x + ".qzeros"] = torch.full((64, 1024), 0x88888888 - 2**32, dtype=torch.int32)
        tensors[x + ".scales"] = sc
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "quantization_config": {
                    "quant_method": "gptq",
                    "bits": 4,
                    "group_size": 128,
                    "sym": True,
                    "desc_act": False,
                    "checkpoint_format": "gptq_v2",
                },
            }
        )
    )
    return [root / "model.safetensors"], planted


def write_gguf(root: Path, total_bytes: float, tname: str) -> tuple[list[Path], dict]:
    """A GGUF file written by gguf-py: ``[4096, 14336]`` tensors of ``tname`` (Q4_K or Q8_0) with random
    codes and small fp16 d (and dmin); planted: a NaN d and a zero d on a block holding data."""
    import gguf
    import numpy as np

    qt = gguf.GGMLQuantizationType[tname]
    blck, size = gguf.GGML_QUANT_SIZES[qt]
    rows, cols = 4096, 14336
    per = rows * cols // blck * size
    n = max(1, math.ceil(total_bytes / per))
    rng = np.random.default_rng(2)
    planted = {"nan": ("blk.0.ffn_up.weight", [3, 7]), "zero": (f"blk.{n - 1}.ffn_up.weight", [4000, 50])}
    path = root / "model.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for i in range(n):
        name = f"blk.{i}.ffn_up.weight"
        raw = rng.integers(0, 256, (rows, cols // blck, size), dtype=np.uint8)
        d_off, m_off = (0, 2) if tname == "Q4_K" else (0, None)
        raw[..., d_off : d_off + 2] = (
            (rng.random((rows, cols // blck)) * 1e-3 + 1e-4)
            .astype(np.float16)
            .view(np.uint8)
            .reshape(rows, cols // blck, 2)
        )
        if m_off is not None:
            raw[..., m_off : m_off + 2] = (
                (rng.random((rows, cols // blck)) * 1e-3)
                .astype(np.float16)
                .view(np.uint8)
                .reshape(rows, cols // blck, 2)
            )
        for kind, (tn, idx) in planted.items():
            if tn == name:
                raw[idx[0], idx[1], d_off : d_off + 2] = np.array(
                    [np.nan if kind == "nan" else 0.0], np.float16
                ).view(np.uint8)
        w.add_tensor(name, raw.reshape(rows, -1), raw_shape=(rows, cols // blck * size), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [path], planted


def quant_child(path: str) -> None:
    """The plain pass and the quantized pass of ``scan_weights``, timed apart, with peak RSS."""
    import resource

    import torch  # start-up, not scan time

    from nan_hunter.load.checkpoint import open_checkpoint
    from nan_hunter.load.quant.registry import scan_quantized
    from nan_hunter.load.safetensors_file import WINDOW
    from nan_hunter.load.weights import scan_item

    if os.environ.get("NH_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["NH_BENCH_THREADS"]))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ck = open_checkpoint(path)
    largest = max(e.nbytes for e in ck.entries.values())
    te = time.perf_counter()
    for item in ck.scan_items():  # the code histogram of every byte (what the plain pass did before issue 34)
        scan_item(item, exact=True)
    t0 = time.perf_counter()
    for item in ck.scan_items():
        scan_item(item)
    t1 = time.perf_counter()
    quantized, unchecked = scan_quantized(ck)
    t2 = time.perf_counter()
    print(
        json.dumps(
            {
                "bytes": ck.nbytes,
                "largest_tensor": largest,
                "plain_s": t1 - t0,
                "quantized_s": t2 - t1,
                "plain_histogram_s": t0 - te,
                "window": WINDOW,
                "rss_after_import": rss0,
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "stripes_read": sum(q.stripes_read for q in quantized),
                "bad": {q.name: [b["index"] for b in q.bad_blocks] for q in quantized if q.bad_blocks},
                "n_quantized": len(quantized),
                "unchecked": unchecked,
            }
        )
    )


def quantized_mode(args: argparse.Namespace) -> int:
    """Each kind's checkpoint written once; then ``--repeat`` rounds, the kinds interleaved in each round,
    each measured in a fresh child after a warm read; median throughput, max peak RSS."""
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="nh_qbench_"))
    kinds = [k for k in args.kinds.split(",") if k]
    writers = {
        "fp8_block": write_quantized,
        "gptq": write_gptq,
        "gguf_q4k": lambda r, b: write_gguf(r, b, "Q4_K"),
        "gguf_q8_0": lambda r, b: write_gguf(r, b, "Q8_0"),
    }
    try:
        made = {}
        for k in kinds:
            root = base / k
            root.mkdir(parents=True, exist_ok=True)
            made[k] = (root, *writers[k](root, args.gb * GB))
        runs: dict[str, list] = {k: [] for k in kinds}
        for _ in range(args.repeat):
            for k in kinds:
                root, shards, planted = made[k]
                load0 = os.getloadavg()
                warm(shards)
                target = str(shards[0]) if k.startswith("gguf") else str(root)
                proc = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--_quant", target],
                    capture_output=True,
                    text=True,
                    cwd=str(HERE.parent),
                    env={
                        **os.environ,
                        "PYTHONPATH": str(HERE.parent),
                        **({"NH_BENCH_THREADS": str(args.threads)} if args.threads else {}),
                    },
                )
                if proc.returncode != 0:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    return 1
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                r["threads"] = args.threads
                r["load"] = [load0, os.getloadavg()]
                r["planted_found"] = all(idx in r["bad"].get(name, []) for name, idx in planted.values())
                runs[k].append(r)
        out = {
            "machine": {
                "cpu": cpu_name(),
                "cores": os.cpu_count(),
                "ram": _ram(),
                "python": platform.python_version(),
                "torch": _version("torch"),
            },
            "kinds": {},
        }
        for k, rs in runs.items():
            gb = rs[0]["bytes"] / GB
            out["kinds"][k] = {
                "bytes": rs[0]["bytes"],
                "largest_tensor": rs[0]["largest_tensor"],
                "runs": rs,
                "plain_GBps": statistics.median(gb / r["plain_s"] for r in rs),
                "plain_histogram_GBps": statistics.median(gb / r["plain_histogram_s"] for r in rs),
                "quantized_pass_GBps": statistics.median(gb / r["quantized_s"] for r in rs),
                "scan_with_dequant_GBps": statistics.median(
                    gb / (r["plain_s"] + r["quantized_s"]) for r in rs
                ),
                "peak_over_import_MB": max((r["peak_rss"] - r["rss_after_import"]) / MB for r in rs),
                "planted_found": all(r["planted_found"] for r in rs),
                "loads": [r["load"] for r in rs],
            }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        qout = Path(args.out).with_name(
            f"scan_throughput_quantized{'_t' + str(args.threads) if args.threads else ''}.json"
        )
        qout.write_text(json.dumps(out, indent=1))
        for k, v in out["kinds"].items():
            print(
                f"{k:10s} {v['bytes'] / GB:.2f} GB  plain {v['plain_GBps']:.2f} GB/s (histogram "
                f"{v['plain_histogram_GBps']:.2f})  quantized pass "
                f"{v['quantized_pass_GBps']:.2f} GB/s  with dequant checks {v['scan_with_dequant_GBps']:.2f} GB/s  "
                f"peak +{v['peak_over_import_MB']:.0f} MB (largest tensor {v['largest_tensor'] / MB:.0f} MB)  "
                f"planted found: {v['planted_found']}  loads {v['loads']}"
            )
        print(f"written: {qout}")
        return 0 if all(v["planted_found"] for v in out["kinds"].values()) else 1
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _ram() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
