"""Where capture puts tensor statistics: one row per measured tensor, read back once.

On CPU the reference fast path runs synchronously (a CPU has nothing to wait for) and rows are
kept as Python lists. On CUDA, rows go into device buffers, written by the Triton kernel (or by
the torch reference's tensor ops) without any host synchronisation, and are copied to the host
in one transfer when ``rows()`` is called for the report.

Device buffers are segments that are never reallocated: each is one row-major block of
``ROW_WORDS`` int64 words per row (the int fields, then the float fields' bits), so growing adds
a segment and copies nothing. Segments start filled with the kernel's starting row, and eager
rows are written once, so the batched launcher needs no init launch.

CUDA graphs: inside stream capture (``torch.cuda.graph``) the sink launches with
``stats_each_into`` (arguments only, no host memory; it initialises its own rows, so every
replay rewrites them) and writes only into *graph segments*: eager rows never share a segment
with captured ones. The first graph segment is a spare allocated and initialised eagerly before
the capture, so captured rows read as empty tensors until the first replay. Graph segments are
kept for the life of the process: a graph may be replayed after its ``watch`` is gone. (A graph
segment that has to be allocated during capture comes from the graph's pool and holds garbage
until the first replay.) After a replay ``rows()`` holds what that replay computed; call
``refresh()`` before reading rows again after another replay.
"""

from __future__ import annotations

import math
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from ..kernels import check_backend, select_backend
from ..kernels import reference as ref
from ..kernels.stats import FLOAT_FIELDS, INT_FIELDS, N_FLOAT, N_INT, TensorStats

CHUNK = 4096  # rows of the first device segment; each further segment doubles, up to MAX_CHUNK
MAX_CHUNK = 65536
ROW_WORDS = N_INT + (N_FLOAT + 1) // 2  # int64 words per row: the ints, then the floats' bits
_EMPTY_ROW = ([0] * (N_INT - 1) + [-1], [0.0, math.inf, 0.0, 0.0])  # what a fresh segment row holds

_MINMAX_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)  # aminmax into a buffer
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_NO_BUFFERS: dict = {}
_aminmax = torch.aminmax
_finite_row = ref.finite_row
_weakref = weakref.ref


def _reader(buf: torch.Tensor) -> Any:
    """What reads ``buf``'s values as Python floats: its numpy view's ``tolist`` where numpy has the
    dtype (a little cheaper than the tensor's own), else the tensor's."""
    try:
        return buf.numpy().tolist
    except (RuntimeError, TypeError):  # bfloat16 has no numpy dtype; torch without numpy
        return buf.tolist


_GRAPH_SEGMENTS: list[Segment] = []  # written by captured graphs, which may outlive their watch


@dataclass(eq=False)  # identity: fields hold tensors, and `seg in _GRAPH_SEGMENTS` must not compare them
class Segment:
    """Rows ``start .. start + cap - 1`` of a device sink: ``ints``/``floats`` are column ranges
    of ``block`` (int64 [cap, ROW_WORDS]), the layout the kernel takes (unit stride along a row)."""

    start: int
    block: torch.Tensor
    ints: torch.Tensor
    floats: torch.Tensor
    graph: bool = False  # rows written by a captured CUDA graph
    stream: Any = None  # CUDA stream that initialised it
    ready: set = field(default_factory=set)  # streams ordered after that initialisation

    @classmethod
    def new(cls, start: int, cap: int, device: torch.device, init: bool = True) -> Segment:
        """A segment whose every row holds the kernel's starting row (zero counts and sums,
        first_nonfinite -1, min_nonzero +inf), so a row never written, or one of an empty
        tensor, reads as an empty tensor. ``init=False`` leaves the memory as allocated."""
        block = (torch.zeros if init else torch.empty)((cap, ROW_WORDS), dtype=torch.int64, device=device)
        floats = block[:, N_INT:].view(torch.float32)[:, :N_FLOAT]
        ints = block[:, :N_INT]
        if init:
            ints[:, INT_FIELDS.index("first_nonfinite")] = -1
            floats[:, FLOAT_FIELDS.index("min_nonzero")] = math.inf
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        return cls(start, block, ints, floats, stream=stream, ready={stream})

    @property
    def cap(self) -> int:
        return self.block.shape[0]

    def rebase(self, start: int) -> Segment:
        self.start = start
        return self

    def order_after_init(self) -> None:
        """Make the current stream wait for the initialisation if it ran on another stream
        (once per stream; never needed inside capture, where graph segments are used)."""
        if self.stream is None:
            return
        cur = torch.cuda.current_stream(self.block.device)
        if cur not in self.ready:
            cur.wait_stream(self.stream)
            self.ready.add(cur)


def _reset(seg: Segment, local: int, count: int) -> None:
    """Rows ``local .. local + count - 1`` of ``seg`` back to the kernel's starting row."""
    seg.block[local : local + count].zero_()
    seg.ints[local : local + count, INT_FIELDS.index("first_nonfinite")] = -1
    seg.floats[local : local + count, FLOAT_FIELDS.index("min_nonzero")] = math.inf


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


_PRIMED: set[str] = set()


def _prime(device: torch.device) -> None:
    """Compile and load every kernel variant the sink may launch (table and per-tensor launchers,
    aligned and unaligned bases, 32- and 64-bit sizes) once per process and device, outside any
    graph capture: a first compile inside ``torch.cuda.graph`` would load a module mid-capture."""
    key = str(device)
    if key in _PRIMED or _capturing(device):
        return
    from ..kernels import triton as tk  # lazy: triton (optional, CUDA only)

    seg = Segment.new(0, 4, device)
    x = torch.zeros(48, dtype=torch.float32, device=device)
    tk.stats_many_into([x, x[1:]], seg.ints, seg.floats, [0, 1])
    tk.stats_each_into([x, x[1:]], seg.ints, seg.floats, 2)
    try:
        tk.prime_large(seg.ints, seg.floats)
    except Exception as e:  # noqa: BLE001 - best effort: only tensors of >= 2^31 elements need these
        warnings.warn(
            f"nan_hunter: could not precompile the kernels for >= 2^31 elements ({e}); "
            "such a tensor inside CUDA-graph capture would compile mid-capture",
            stacklevel=2,
        )
    _PRIMED.add(key)


class StatsSink:
    """Rows of tensor statistics for one capture. ``launch``: "auto" (the pointer table, or
    per-tensor launches inside CUDA-graph capture), "table" or "each" (always per tensor).
    Inside capture the per-tensor launcher is always used. ``underflow``: the CPU fast path also
    measures abs-min and the ``under_*`` counts (the kernels always do)."""

    def __init__(
        self,
        device: torch.device | str | None = None,
        backend: str | None = None,
        launch: str = "auto",
        underflow: bool = True,
    ):
        if launch not in ("auto", "table", "each"):
            raise ValueError(f"launch must be 'auto', 'table' or 'each', got {launch!r}")
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.backend = backend or select_backend(dev.type)
        check_backend(self.backend, dev.type)
        self.launch = launch
        self._device_rows = self.backend == "triton" or dev.type != "cpu"  # rows in device segments
        # host rows of finite tensors also carry abs-min and the flush-to-zero counts (about 2-5x the
        # cost of the one aminmax pass that tells finite from not); the kernels always compute them
        self.underflow = underflow
        self.n = 0
        self.bytes_read = 0  # bytes of the distinct tensors measured (what the kernel reads)
        self.graph_rows = False  # some rows are written by a captured CUDA graph
        self.unmeasured: list[tuple[int, str]] = []  # (row, why) of tensors that could not be read
        self._host: list[tuple[list[int], list[float]]] = []
        # host rows that count a NaN or ±inf (a host sink knows as it writes them: a step none of
        # whose rows is here is finite without reading its rows)
        self.bad_rows: set[int] = set()
        self._host_rows: dict[
            int, tuple[list[int], list[float]]
        ] = {}  # device sink: rows computed on the host
        self._padding: list[range] = []  # rows skipped when switching between eager and graph segments
        self._segments: list[Segment] = []
        self._spare: Segment | None = None  # an initialised segment kept for the next graph capture
        self._seen: dict[int, tuple[weakref.ref, int, int]] = {}
        self._free: list[tuple[int, int]] = []  # [lo, hi) eager rows given back by ``free``, by lo
        self._pool: list[int] = []  # host sink: rows given back by ``free``, reused one by one in any order
        # host sink, underflow off: per dtype, how to read (min, max) back and the two 0-dim views of
        # a 2-element buffer ``torch.aminmax`` writes into; used only from the thread that made it
        self._minmax: dict[torch.dtype, tuple[Any, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._thread = threading.get_ident()
        if not self._device_rows and not underflow:
            with torch.inference_mode(False):  # written from inside inference mode and out of it
                for dt in _MINMAX_DTYPES:
                    buf = torch.empty(2, dtype=dt)
                    self._minmax[dt] = (_reader(buf), (buf[0], buf[1]))
        self.last_new: tuple[int, int] = (
            0,
            0,
        )  # device sink: (first row, count) the last measure_many allocated
        self._rows_cache: list[TensorStats] | None = None
        self._kernel_dtypes: frozenset = frozenset()
        if self.backend == "triton":
            from ..kernels import triton as tk  # lazy: triton (optional, CUDA only)

            self._kernel_dtypes = frozenset(tk.SUPPORTED_DTYPES)
            if dev.type == "cuda":
                _prime(dev)

    # -- device segments ------------------------------------------------------------------
    def _end(self) -> int:
        return self._segments[-1].start + self._segments[-1].cap if self._segments else 0

    def _switch(self, graph: bool) -> None:
        """Start a new segment when the last one is of the other kind (eager vs graph)."""
        if self._segments and self._segments[-1].graph != graph:
            end = self._end()
            if end > self.n:
                self._padding.append(range(self.n, end))
            self.n = end

    def _ensure(self, rows: int, graph: bool) -> None:
        while self._end() < rows:
            end = self._end()
            if graph and self._spare is not None:
                seg, self._spare = self._spare.rebase(end), None
            else:
                cap = min(MAX_CHUNK, CHUNK << len(self._segments))
                # inside capture, fills would only be recorded: leave the memory as allocated
                seg = Segment.new(end, cap, self.device, init=not graph)
            seg.graph = graph
            if graph:
                _GRAPH_SEGMENTS.append(seg)
            self._segments.append(seg)
        if not graph and self._spare is None and self.backend == "triton" and self.device.type == "cuda":
            self._spare = Segment.new(0, CHUNK, self.device)  # ready for a capture

    def _pieces(self, first: int, count: int) -> list[tuple[Segment, int, int]]:
        """(segment, first local row, number of rows) covering rows first .. first + count - 1."""
        out = []
        for seg in self._segments:
            lo, hi = max(first, seg.start), min(first + count, seg.start + seg.cap)
            if lo < hi:
                out.append((seg, lo - seg.start, hi - lo))
        return out

    def measure(self, t: torch.Tensor) -> int:
        """Append the stats of ``t`` and return its row (see ``measure_many``)."""
        return self.measure_many([t])[0]

    def measure_many(self, tensors: list[torch.Tensor], cache: bool = True) -> list[int]:
        """Append the stats of several tensors and return their rows. A tensor already measured
        (same object, unchanged since) returns its earlier row without being read again; with
        ``cache=False`` every tensor gets a row of its own and none is remembered. On the Triton
        backend all new tensors go into one batched launch (a pointer table; a second one only
        when some base address is not 16-byte aligned), so a hook costs one launch whatever the
        number of tensors it sees. New rows are consecutive (``last_new``), taken from rows given
        back by ``free`` when a range is large enough, else appended."""
        if not self._device_rows:
            return [r for _, r in self.measure_host([("", t) for t in tensors], cache)]
        capturing = _capturing(self.device)
        self._switch(capturing)
        rows: list[int] = []
        new: list[torch.Tensor] = []
        pos: dict[int, int] = {}  # id -> index in new, for a tensor given twice in one call
        for t in tensors:
            # inference tensors have no version counter: they are never reused from the cache
            cacheable = cache and not t.is_inference()
            hit = self._seen.get(id(t)) if cacheable else None
            if hit is not None and hit[0]() is t and t._version == hit[1]:
                rows.append(hit[2])
                continue
            if cacheable and id(t) in pos:
                rows.append(-1 - pos[id(t)])
                continue
            if cacheable:
                pos[id(t)] = len(new)
            rows.append(-1 - len(new))  # filled in once the rows are allocated
            new.append(t)
        if not new:
            self.last_new = (self.n, 0)
            return rows
        first = self._alloc(len(new), capturing)
        self.last_new = (first, len(new))
        rows = [r if r >= 0 else first - 1 - r for r in rows]
        for i, t in enumerate(new):
            self.bytes_read += t.numel() * t.element_size()
            if id(t) in pos:
                try:
                    self._seen[id(t)] = (weakref.ref(t), t._version, first + i)
                except TypeError:  # pragma: no cover - tensors without weakref support
                    pass
        self._rows_cache = None
        self._ensure(self.n, capturing)
        self.graph_rows |= capturing
        done = 0
        for seg, local, count in self._pieces(first, len(new)):
            part = new[done : done + count]
            done += count
            if not capturing:
                seg.order_after_init()
            self._write(seg, local, part, capturing)
        return rows

    def measure_labelled(
        self, items: list[tuple[str, torch.Tensor]], cache: bool = True, new_rows: list[int] | None = None
    ) -> list[tuple[str, int]]:
        """``measure_many`` of (label, tensor) pairs, as (label, row) pairs. ``new_rows``: the rows
        allocated here are appended to it (on a host sink they need not be consecutive)."""
        if not self._device_rows:
            return self.measure_host(items, cache, new_rows)
        rows = self.measure_many([t for _, t in items], cache)
        if new_rows is not None:
            first, n = self.last_new
            new_rows.extend(range(first, first + n))
        return [(label, r) for (label, _), r in zip(items, rows)]

    def measure_host(
        self, items: list[tuple[str, torch.Tensor]], cache: bool = True, new_rows: list[int] | None = None
    ) -> list[tuple[str, int]]:
        """``measure_labelled`` on a host sink: the same rows, computed here and now (nothing to wait
        for), with the least Python per tensor, since a watched forward runs this in every hook. A
        new tensor takes a row given back by ``free`` (else a new one): rows are not consecutive, and
        ``new_rows`` collects them. With underflow off, in the thread that made the sink, a plain
        tensor's statistic is one ``torch.aminmax`` into a reused buffer read with one ``tolist``, its
        row ``reference.finite_row`` (what ``quick_row`` gives); anything else, and any tensor that
        holds a NaN or ±Inf, goes the general way (``_host_row``)."""
        seen = self._seen
        host = self._host
        pool = self._pool
        minmax = self._minmax if self._thread == threading.get_ident() else _NO_BUFFERS
        refs: list[tuple[str, int]] = []
        read = 0
        for label, t in items:
            version = None
            if cache:
                try:
                    version = t._version
                except RuntimeError:  # an inference tensor has no version counter: never reused
                    pass
                else:
                    hit = seen.get(id(t))
                    if hit is not None and hit[1] == version and hit[0]() is t:
                        refs.append((label, hit[2]))  # measured earlier in this forward
                        continue
            row = pool.pop() if pool else len(host)
            q = None
            dt = t.dtype
            buf = minmax.get(dt) if type(t) in _PLAIN_TENSORS else None
            if buf is not None:
                n = t.numel()
                read += n * dt.itemsize
                if n:
                    try:
                        _aminmax(t.detach() if t.requires_grad else t, out=buf[1])
                    except Exception:  # noqa: BLE001 - another device, a layout aminmax refuses: the general way
                        pass
                    else:
                        lo, hi = buf[0]()
                        q = _finite_row(n, lo, hi)
            else:
                read += t.nbytes
            if q is None:
                q = self._host_row(t, row)
            if row == len(host):
                host.append(q)
                self.n = row + 1
            else:
                host[row] = q
            if new_rows is not None:
                new_rows.append(row)
            if version is not None:
                try:
                    seen[id(t)] = (_weakref(t), version, row)
                except TypeError:  # pragma: no cover - tensors without weakref support
                    pass
            refs.append((label, row))
        self.bytes_read += read
        self._rows_cache = None
        return refs

    def _alloc(self, count: int, capturing: bool) -> int:
        """First row of ``count`` consecutive rows: from a freed eager range (first fit), else at the end."""
        if not capturing:
            for i, (lo, hi) in enumerate(self._free):
                if hi - lo >= count:
                    if hi - lo == count:
                        del self._free[i]
                    else:
                        self._free[i] = (lo + count, hi)
                    return lo
        first = self.n
        self.n += count
        return first

    def free(self, rows: list[int]) -> None:
        """Give rows back for reuse (those of a forward folded into aggregates). Device rows are
        reset to the kernel's starting row, since the kernel adds into a row it writes; a host row
        is written whole when reused. Rows written by a captured CUDA graph are never given back (a
        replay rewrites them)."""
        if not rows:
            return
        gone = set(rows)
        if self.bad_rows:
            self.bad_rows -= gone
        if self.unmeasured:
            self.unmeasured = [(r, why) for r, why in self.unmeasured if r not in gone]
        self._rows_cache = None
        if not self._device_rows:  # host rows: reused one by one (``measure_host``), in any order
            self._pool.extend(gone)
            return
        spans: list[tuple[int, int]] = []
        for r in sorted(gone):
            if spans and spans[-1][1] == r:
                spans[-1] = (spans[-1][0], r + 1)
            else:
                spans.append((r, r + 1))
        for lo, hi in spans:
            if self._host_rows:
                for r in range(lo, hi):
                    self._host_rows.pop(r, None)
            if self._device_rows:
                for seg, local, count in self._pieces(lo, hi - lo):
                    if seg.graph:
                        raise ValueError("rows written by a captured CUDA graph cannot be freed")
                    _reset(seg, local, count)
        merged = sorted(self._free + spans)
        self._free = []
        for lo, hi in merged:
            if self._free and self._free[-1][1] >= lo:
                self._free[-1] = (self._free[-1][0], max(self._free[-1][1], hi))
            else:
                self._free.append((lo, hi))

    @property
    def rows_in_use(self) -> int:
        """Rows allocated and not given back (what the sink's memory grows with)."""
        return self.n - sum(hi - lo for lo, hi in self._free) - len(self._pool)

    def _host_row(self, t: torch.Tensor, row: int) -> tuple[list[int], list[float]]:
        """A host row for ``t``; a tensor the reference cannot read gets an empty row and a note
        (a statistic never breaks the user's forward)."""
        try:
            q = ref.quick_row(t, underflow=self.underflow)
            if q is None:
                ints, floats = ref.full_row(t)
                q = (ints.tolist(), floats.tolist())
                if q[0][1] or q[0][2] or q[0][3]:  # nan, posinf, neginf
                    self.bad_rows.add(row)
            return q
        except Exception as e:  # noqa: BLE001 - never break the user's forward over a statistic
            self.unmeasured.append((row, f"{type(t).__name__} {t.dtype} on {t.device}: {e}"))
            return _EMPTY_ROW[0][:], _EMPTY_ROW[1][:]

    def _kernel_can_read(self, t: torch.Tensor) -> bool:
        return (
            t.dtype in self._kernel_dtypes
            and t.device == self.device
            and t.layout == torch.strided
            and type(t) in (torch.Tensor, torch.nn.Parameter)
            and not t.is_nested
        )

    def _write(self, seg: Segment, local: int, part: list[torch.Tensor], capturing: bool) -> None:
        """Rows ``local ..`` of ``seg`` for ``part``: the kernel where it can read the tensor,
        the torch reference otherwise (float64, another device, tensor subclasses)."""
        if self.backend == "triton" and all(self._kernel_can_read(t) for t in part):
            from ..kernels import triton as tk  # lazy: triton (optional, CUDA only)

            if capturing or self.launch == "each":
                tk.stats_each_into(part, seg.ints, seg.floats, local)
            else:
                # eager rows are written once into initialised segments: no init launch
                tk.stats_many_into(
                    part, seg.ints, seg.floats, list(range(local, local + len(part))), init=False
                )
            return
        for i, t in enumerate(part):
            if self.backend == "triton" and self._kernel_can_read(t):
                from ..kernels import triton as tk  # lazy: triton (optional, CUDA only)

                tk.stats_each_into([t], seg.ints, seg.floats, local + i)
                continue
            row = seg.start + local + i
            try:
                if t.device.type == "cpu" and self.device.type != "cpu":
                    self._host_rows[row] = self._host_row(
                        t, row
                    )  # a host tensor: computed here, no device copy
                    continue
                ints, floats = ref.full_row(t)
                seg.ints[local + i].copy_(ints.to(self.device, non_blocking=True))
                seg.floats[local + i].copy_(floats.to(self.device, non_blocking=True))
            except Exception as e:  # noqa: BLE001 - never break the user's forward over a statistic
                self.unmeasured.append((row, f"{type(t).__name__} {t.dtype} on {t.device}: {e}"))

    def refresh(self) -> None:
        """Forget the rows read back, so the next ``rows()`` reads the device again (after a
        CUDA-graph replay has rewritten captured rows)."""
        self._rows_cache = None

    def rows(self) -> list[TensorStats]:
        """All rows as host objects: one device-to-host copy of every row written, cached until
        more rows are written or ``refresh()`` is called."""
        if self._rows_cache is not None and len(self._rows_cache) == self.n:
            return self._rows_cache
        if not self._device_rows:
            out = [TensorStats.from_row(i, f) for i, f in self._host]
        else:
            parts = [seg.block[:count] for seg, _, count in self._pieces(0, self.n)]
            block = (parts[0] if len(parts) == 1 else torch.cat(parts)) if parts else None
            out = []
            if block is not None:
                host = block.cpu()
                ints = host[:, :N_INT].tolist()
                floats = host[:, N_INT:].contiguous().view(torch.float32)[:, :N_FLOAT].tolist()
                for span in self._padding:  # never written (graph memory may hold anything)
                    for r in span:
                        ints[r], floats[r] = _EMPTY_ROW
                for r, (i, f) in self._host_rows.items():
                    ints[r], floats[r] = i, f
                out = [TensorStats.from_row(i, f) for i, f in zip(ints, floats)]
        self._rows_cache = out
        return out

    def read(self, rows: list[int]) -> dict[int, tuple[list[int], list[float]]]:
        """Some rows as raw host rows (ints, floats), for folding a forward: one gather and one
        transfer on a device sink; straight from the host lists otherwise. The count fields
        (numel, nan, posinf, neginf) are always set; a float field not computed is NaN."""
        if not rows:
            return {}
        if not self._device_rows:
            host = self._host
            return {r: host[r] for r in rows}
        want = sorted(set(rows))
        parts, order = [], []
        for seg in self._segments:
            local = [r - seg.start for r in want if seg.start <= r < seg.start + seg.cap]
            if local:
                idx = torch.tensor(local, dtype=torch.long, device=seg.block.device)
                parts.append(seg.block.index_select(0, idx))
                order += [seg.start + i for i in local]
        got = (parts[0] if len(parts) == 1 else torch.cat(parts)).cpu()
        ints = got[:, :N_INT].tolist()
        floats = got[:, N_INT:].contiguous().view(torch.float32)[:, :N_FLOAT].tolist()
        return {r: self._host_rows.get(r, (i, f)) for r, i, f in zip(order, ints, floats)}

    def host_table(self) -> list[tuple[list[int], list[float]]] | None:
        """A host sink's rows, indexable by row as ``read`` gives them (the live table: read, never
        changed; rows given back by ``free`` are rewritten when reused); None on a device sink."""
        return None if self._device_rows else self._host

    def flag_nonfinite(self, any_rows: list[int], data_rows: list[int]) -> torch.Tensor:
        """A 0-dim bool tensor on the sink's device, computed without a host synchronisation: True
        when a row of ``any_rows`` counts a NaN or ±inf, or a row of ``data_rows`` a NaN or +inf
        (the failing-forward rule, for a device sink that cannot read its rows every forward)."""
        flags = []
        for rows, hi in ((any_rows, 1 + 3), (data_rows, 1 + 2)):  # INT_FIELDS[1:hi]: nan, posinf[, neginf]
            for seg in self._segments:
                local = [r - seg.start for r in rows if seg.start <= r < seg.start + seg.cap]
                if not local:
                    continue
                idx = torch.tensor(local, dtype=torch.long)
                if self.device.type == "cuda":
                    idx = idx.pin_memory().to(self.device, non_blocking=True)
                flags.append(seg.ints.index_select(0, idx)[:, 1:hi].sum() > 0)
        if not flags:
            return torch.zeros((), dtype=torch.bool, device=self.device)
        return torch.stack(flags).any()

    def forget_tensors(self) -> None:
        """Drop the identity cache (between forwards: ids may be reused)."""
        self._seen.clear()
