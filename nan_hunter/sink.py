"""Where capture puts tensor statistics: one row per measured tensor, read back once.

On CPU the reference fast path runs synchronously (a CPU has nothing to wait for) and rows are
kept as Python lists. On CUDA, rows go into preallocated device buffers, written by the Triton
kernel (or by the torch reference's tensor ops) without any host synchronisation; the buffers
are copied to the host once, when ``rows()`` is called for the report.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch

from .kernels import reference as ref
from .kernels import select_backend
from .stats import N_FLOAT, N_INT, TensorStats

CHUNK = 4096  # rows added each time a device buffer grows


class StatsSink:
    def __init__(self, device: torch.device | str | None = None, backend: str | None = None):
        dev = torch.device(device) if device is not None else torch.device("cpu")
        self.device = dev
        self.backend = backend or select_backend(dev.type)
        self.n = 0
        self._host: list[tuple[list[int], list[float]]] = []
        self._ints: torch.Tensor | None = None
        self._floats: torch.Tensor | None = None
        self._seen: dict[int, tuple[weakref.ref, int, int]] = {}
        self._rows_cache: list[TensorStats] | None = None
        if self.backend == "triton":
            from .kernels import triton as tk  # noqa: F401  (fail early if broken)

    # -- device buffers -------------------------------------------------------------------
    def _ensure(self, rows: int) -> None:
        cap = 0 if self._ints is None else self._ints.shape[0]
        if rows <= cap:
            return
        new = max(rows, cap + CHUNK)
        ints = torch.empty((new, N_INT), dtype=torch.int64, device=self.device)
        floats = torch.empty((new, N_FLOAT), dtype=torch.float32, device=self.device)
        if self._ints is not None:
            ints[:cap].copy_(self._ints)
            floats[:cap].copy_(self._floats)
        self._ints, self._floats = ints, floats

    def measure(self, t: torch.Tensor) -> int:
        """Append the stats of ``t`` and return its row (see ``measure_many``)."""
        return self.measure_many([t])[0]

    def measure_many(self, tensors: list[torch.Tensor]) -> list[int]:
        """Append the stats of several tensors and return their rows. A tensor already measured
        (same object, unchanged since) returns its earlier row without being read again. On the
        Triton backend all new tensors go into one batched launch (a pointer table), so a hook
        costs one launch whatever the number of tensors it sees."""
        rows: list[int] = []
        new: list[torch.Tensor] = []
        new_rows: list[int] = []
        for t in tensors:
            # inference tensors have no version counter: they are never reused from the cache
            cacheable = not t.is_inference()
            hit = self._seen.get(id(t)) if cacheable else None
            if hit is not None and hit[0]() is t and t._version == hit[1]:
                rows.append(hit[2])
                continue
            row = self.n
            self.n += 1
            rows.append(row)
            new.append(t)
            new_rows.append(row)
            if cacheable:
                try:
                    self._seen[id(t)] = (weakref.ref(t), t._version, row)
                except TypeError:  # pragma: no cover - tensors without weakref support
                    pass
        if not new:
            return rows
        self._rows_cache = None
        if self.backend == "triton":
            from .kernels import triton as tk

            self._ensure(self.n)
            tk.stats_many_into(new, self._ints, self._floats, new_rows)
        elif self.device.type == "cpu":
            for t in new:
                q = ref.quick_row(t)
                if q is None:
                    ints, floats = ref.full_row(t)
                    q = (ints.tolist(), floats.tolist())
                self._host.append(q)
        else:
            self._ensure(self.n)
            for t, row in zip(new, new_rows):
                ints, floats = ref.full_row(t)
                self._ints[row].copy_(ints, non_blocking=True)
                self._floats[row].copy_(floats, non_blocking=True)
        return rows

    def rows(self) -> list[TensorStats]:
        """All rows as host objects: the one device→host copy of a capture."""
        if self._rows_cache is not None and len(self._rows_cache) == self.n:
            return self._rows_cache
        if self._ints is None:
            out = [TensorStats.from_row(i, f) for i, f in self._host]
        else:
            ints = self._ints[: self.n].cpu().tolist()
            floats = self._floats[: self.n].cpu().tolist()
            out = [TensorStats.from_row(i, f) for i, f in zip(ints, floats)]
        self._rows_cache = out
        return out

    def forget_tensors(self) -> None:
        """Drop the identity cache (between forwards: ids may be reused)."""
        self._seen.clear()


def is_float_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and not x.is_meta


def flatten(obj: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, torch.Tensor]]:
    """Floating tensors inside what real modules take and return: tensors, tuples, lists, dicts,
    ``ModelOutput`` (an OrderedDict), dataclasses; None and non-float tensors are skipped."""
    if isinstance(obj, torch.Tensor):
        return [(prefix or "out", obj)] if is_float_tensor(obj) else []
    if depth > 6 or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return []
    out: list[tuple[str, torch.Tensor]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += flatten(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += flatten(v, f"{prefix}[{i}]", depth + 1)
    elif hasattr(obj, "__dataclass_fields__"):
        for k in obj.__dataclass_fields__:
            out += flatten(getattr(obj, k, None), f"{prefix}.{k}" if prefix else k, depth + 1)
    return out


def nan_safe(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v
