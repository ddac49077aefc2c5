"""Records every weights scan a process runs (``scan_weights``), keyed by the bytes it read.

Put this folder first on ``PYTHONPATH`` with ``NANHUNTER_PARITY_LOG=DIR`` set: every Python process
that imports ``nan_hunter.load.weights`` (pytest, its xdist workers, the CLI children the tests start)
appends one JSON line per scan to ``DIR/<pid>.jsonl``: the checkpoint's key (sha256 of its files, its
``config.json``, its format and the ``exact`` flag) and the report's ``weights`` block, or the
one-line error. ``compare.py`` then diffs two such logs (a tree before and after a change), scan by
scan. Not a test: nothing here is collected by pytest.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys

TARGET = "nan_hunter.load.weights"


MAX_HASHED = 1 << 30  # a checkpoint larger than this (the sparse 30 GB test) is not recorded


def _key(ck, exact: bool) -> str | None:
    h = hashlib.sha256()
    paths = [
        getattr(st, "real", p) for p, st in sorted(ck._files.items(), key=lambda kv: str(kv[0]))
    ] or list(ck.files)
    if sum(os.path.getsize(p) for p in paths) > MAX_HASHED:
        return None
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        h.update(b"\0file\0")
    if ck.config_path is not None:
        try:
            h.update(open(ck.config_path, "rb").read())
        except OSError:
            pass
    h.update(f"{ck.format}|{bool(exact)}|{sorted(ck.names())}".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _wrap(mod) -> None:
    inner = mod.scan_weights

    def scan_weights(ck, exact=False, progress=None):
        rec = {"format": ck.format, "exact": bool(exact), "path": str(ck.path)}
        try:
            rec["key"] = _key(ck, exact)
        except Exception as e:  # noqa: BLE001 - a file that cannot be hashed is not recorded
            rec["key"] = None
            rec["key_error"] = repr(e)
        try:
            ws = inner(ck, exact=exact, progress=progress)
        except BaseException as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            _write(rec)
            raise
        try:
            from nan_hunter.config import default_config
            from nan_hunter.explain.weights_verdict import weights_section
            from nan_hunter.report import json_safe

            rec["weights"] = json_safe(weights_section(ws, default_config()))
        except Exception as e:  # noqa: BLE001
            rec["record_error"] = repr(e)
        _write(rec)
        return ws

    mod.scan_weights = scan_weights


def _write(rec: dict) -> None:
    d = os.environ["NANHUNTER_PARITY_LOG"]
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{os.getpid()}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, sort_keys=True, ensure_ascii=True, default=str) + "\n")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module)

        loader.exec_module = exec_and_wrap
        return spec


if os.environ.get("NANHUNTER_PARITY_LOG"):
    sys.meta_path.insert(0, _Finder())
