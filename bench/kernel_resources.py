"""Compiler resource report of the Triton stats kernel for a GPU target, without a GPU.

Compiles ``_stats_kernel`` ahead of time for ``--arch`` (default sm_90, the H100/H200) at each
(block size, warps) configuration and both launchers (scalar arguments / pointer table), and
reads registers per thread, spills, stack and shared memory from the cubin with the
``cuobjdump`` that ships with triton. From the registers it derives the resident warps per SM
(65,536 registers per SM, allocated per warp in units of 256; at most 64 warps per SM), the
first number to look at for a streaming reduction that must keep enough loads in flight.

    python bench/kernel_resources.py                 # writes bench/_out/kernel_resources.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# argument types of a typical call: addresses and sizes 64-bit, small ints 32-bit
SIGNATURE = {
    "table_ptr": "*i64",
    "n_entries": "i32",
    "ints_ptr": "*i64",
    "floats_ptr": "*fp32",
    "ints_stride": "i32",
    "floats_stride": "i32",
    "iters": "i32",
    "addr": "i64",
    "numel": "i64",
    "n_cols": "i64",
    "stride": "i64",
    "row": "i32",
    "fmt": "i32",
    "tiny_bits": "i32",
    "BLOCK": "constexpr",
    "SINGLE": "constexpr",
    "ALIGN": "constexpr",
}


def resources(cubin: bytes, cuobjdump: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        text = subprocess.run(
            [cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    finally:
        os.unlink(f.name)
    line = next(ln for ln in text.splitlines() if "REG:" in ln)
    fields = dict(item.split(":", 1) for item in line.split() if ":" in item)
    return {
        "registers": int(fields["REG"]),
        "stack": int(fields["STACK"]),
        "shared": int(fields["SHARED"]),
        "local": int(fields["LOCAL"]),
    }


def resident_warps(regs: int, warps_per_block: int) -> int:
    per_warp = -(-regs * 32 // 256) * 256
    blocks = min(65536 // (per_warp * warps_per_block), 64 // warps_per_block, 32)
    return blocks * warps_per_block


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90 = H100/H200)")
    ap.add_argument("--configs", default="1024x4,1024x8,512x4,2048x8,4096x8", help="block x warps list")
    ap.add_argument("--out", default=str(HERE / "_out" / "kernel_resources.json"))
    args = ap.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from nan_hunter.kernels import triton as tk

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    rows = []
    for cfg in args.configs.split(","):
        block, warps = (int(v) for v in cfg.split("x"))
        for single in (True, False):
            src = ASTSource(
                tk._stats_kernel, SIGNATURE, constexprs={"BLOCK": block, "SINGLE": single, "ALIGN": 16}
            )
            k = triton.compile(src, target=GPUTarget("cuda", args.arch, 32), options={"num_warps": warps})
            r = resources(k.asm["cubin"], cuobjdump)
            r.update(
                block=block,
                num_warps=warps,
                launcher="scalars" if single else "table",
                elements_per_thread=block // (32 * warps),
                default=(block, warps) == (tk.BLOCK_SIZE, tk.NUM_WARPS),
                resident_warps_per_sm=resident_warps(r["registers"], warps),
            )
            rows.append(r)
    print(f"sm_{args.arch}, triton {triton.__version__}")
    print(
        f"{'block':>6} {'warps':>5} {'elem/thr':>8} {'launcher':>8} {'regs':>5} {'spill':>5} {'warps/SM':>8}"
    )
    for r in rows:
        print(
            f"{r['block']:>6} {r['num_warps']:>5} {r['elements_per_thread']:>8} {r['launcher']:>8} "
            f"{r['registers']:>5} {r['local']:>5} {r['resident_warps_per_sm']:>8}{'  (default)' if r['default'] else ''}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"arch": f"sm_{args.arch}", "triton": triton.__version__, "rows": rows}, indent=2)
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
