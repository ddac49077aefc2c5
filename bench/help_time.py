"""How long ``nanhunter --help`` and ``nanhunter scan --help`` take, against the peers every Python
CLI pays: the bare interpreter (``python -c pass``) and importing typer's rich help
(``python -c "import typer.rich_utils"``), in fresh processes, interleaved.

The cost of a command is the CPU time of its process (user + system, the interpreter's start-up
included): wall time on a shared machine also counts other processes' turns. Medians of
``--repeat`` rounds are printed with the ratio to the typer peer; the goal (BENCHMARKS.md) is < 0.3 s.

    python bench/help_time.py --repeat 9
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from machine import cpu_name

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import typer.rich_utils": [sys.executable, "-c", "import typer.rich_utils"],
    "nanhunter --help": [sys.executable, "-m", "nan_hunter", "--help"],
    "nanhunter scan --help": [sys.executable, "-m", "nan_hunter", "scan", "--help"],
}


def cpu_and_wall(cmd: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True, env={**os.environ, "COLUMNS": "80"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    for cmd in CASES.values():  # warm the page cache and the bytecode caches
        cpu_and_wall(cmd)
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in CASES}
    for _ in range(args.repeat):
        for name, cmd in CASES.items():
            runs[name].append(cpu_and_wall(cmd))
    print(
        f"machine: {cpu_name()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {args.repeat} rounds"
    )
    peer = statistics.median(c for c, _ in runs["import typer.rich_utils"])
    for name, rs in runs.items():
        cpu = statistics.median(c for c, _ in rs)
        wall = statistics.median(w for _, w in rs)
        print(
            f"{name:26s} CPU {cpu * 1000:7.1f} ms  wall {wall * 1000:7.1f} ms  ({cpu / peer:.2f}x typer's help import)"
        )


if __name__ == "__main__":
    main()
