"""Child process of the scan fuzz test: ``nan_hunter.scan`` on every case, under a memory limit.

Usage: ``python scan_cases.py CASES.json RESULTS.jsonl``. After one warm-up scan (so torch's
thread pools and allocator arenas exist), the address space is capped at its current peak plus
``HEADROOM`` bytes: the case files are tiny, so a loader that allocates by a declared shape
instead of the file's real size fails with MemoryError, which is reported, not survived.
Every ``open`` is audited; opens inside a case's ``outside`` directory are reported.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

HEADROOM = 1 << 30


def _vm_peak_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmPeak:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmPeak")


def main(cases_file: str, results_file: str) -> None:
    spec = json.loads(Path(cases_file).read_text())
    import nan_hunter
    from nan_hunter.errors import BadInput

    opened: list[str] = []

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(audit)
    nan_hunter.scan(spec["warmup"])
    resource.setrlimit(resource.RLIMIT_AS, (_vm_peak_bytes() + HEADROOM, resource.RLIM_INFINITY))
    secret = spec["secret"]
    with open(results_file, "w") as out:
        for case in spec["cases"]:
            opened.clear()
            rec: dict = {"id": case["id"]}
            t = time.monotonic()
            try:
                rep = nan_hunter.scan(case["path"])
                rec["code"] = rep.exit_code()
                rec["leak"] = secret in json.dumps(rep.to_dict(), default=str)
            except BadInput as e:
                rec["code"], rec["msg"] = 2, str(e)
                rec["leak"] = secret in str(e)
            except MemoryError:
                rec["code"] = "MemoryError"
            except Exception as e:  # any other exception is a bug: an internal error (exit 3)
                rec["code"] = f"{type(e).__name__}: {str(e)[:300]}"
            rec["seconds"] = time.monotonic() - t
            outside = case.get("outside")
            if outside:
                root = Path(outside).resolve()
                rec["opened_outside"] = [
                    p
                    for p in opened
                    if root in Path(os.path.abspath(p)).resolve().parents or p == "/etc/passwd"
                ]
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
