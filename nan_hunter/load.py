"""Checkpoints: a ``.safetensors`` file, a sharded index, a Hugging Face directory, or ``.pt``/``.bin``.

Safetensors files are parsed here (8-byte little-endian header length, JSON header, raw data)
so that every way a file can be broken gets its own clear message, and tensors are views into
a private memory map (``mmap.ACCESS_COPY``): nothing is read until a tensor is touched, and
nothing can ever be written back to the file. ``.pt``/``.bin`` go only through
``torch.load(weights_only=True)``: never plain unpickling.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    import torch

# safetensors dtype tag → (torch dtype name, bytes per element)
_ST_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference implementation's own limit
HINT_REGEN = "re-export or re-download the checkpoint"


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: file, dtype tag, shape and byte range within the data section."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class SafetensorsFile:
    """One parsed safetensors file; tensors are lazy views into a private mmap."""

    def __init__(self, path: Path):
        self.path = path
        try:
            size = path.stat().st_size
        except OSError as e:  # pragma: no cover - raced deletion
            raise BadInput(f"cannot read {path}: {e.strerror}") from None
        if size < 8:
            raise BadInput(f"{path}: file is {size} bytes, too short to be safetensors (truncated?); {HINT_REGEN}")
        with open(path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            if hlen == 0 or hlen > _MAX_HEADER or 8 + hlen > size:
                raise BadInput(
                    f"{path}: header length {hlen} does not fit a {size}-byte file "
                    f"(truncated or not a safetensors file); {HINT_REGEN}"
                )
            raw = f.read(hlen)
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise BadInput(f"{path}: the safetensors header is not valid JSON (corrupt file); {HINT_REGEN}") from None
        if not isinstance(header, dict):
            raise BadInput(f"{path}: the safetensors header is not a JSON object; {HINT_REGEN}")
        self.metadata = header.pop("__metadata__", None) or {}
        self.data_start = 8 + hlen
        data_len = size - self.data_start
        self.entries: dict[str, TensorEntry] = {}
        for name, spec in header.items():
            try:
                tag = spec["dtype"]
                shape = tuple(int(s) for s in spec["shape"])
                begin, end = (int(o) for o in spec["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise BadInput(f"{path}: malformed header entry for tensor {name!r}; {HINT_REGEN}") from None
            if tag not in _ST_DTYPES:
                raise BadInput(f"{path}: tensor {name!r} has unsupported dtype {tag!r}")
            e = TensorEntry(name, path, tag, shape, begin, end)
            if end > data_len or begin > end:
                raise BadInput(
                    f"{path}: tensor {name!r} ends at byte {end} but the data section has {data_len} bytes "
                    f"(truncated file); {HINT_REGEN}"
                )
            if e.numel * _ST_DTYPES[tag][1] != e.nbytes:
                raise BadInput(f"{path}: tensor {name!r} has {e.nbytes} bytes for shape {list(shape)} {tag}; {HINT_REGEN}")
            self.entries[name] = e
        self._mm: mmap.mmap | None = None

    def _map(self) -> mmap.mmap | None:
        if self._mm is None and os.path.getsize(self.path) > 0:
            with open(self.path, "rb") as f:
                # ACCESS_COPY: a private copy-on-write mapping; writes can never reach the file.
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._mm

    def tensor(self, name: str) -> torch.Tensor:
        import torch

        e = self.entries[name]
        tname, size = _ST_DTYPES[e.dtype]
        dtype = getattr(torch, tname)
        if e.numel == 0:
            return torch.empty(e.shape, dtype=dtype)
        mm = self._map()
        off = self.data_start + e.begin
        if off % size == 0:
            t = torch.frombuffer(mm, dtype=dtype, count=e.numel, offset=off)
        else:  # unaligned data: one copy of this tensor only
            t = torch.frombuffer(bytearray(mm[off: off + e.nbytes]), dtype=dtype)
        return t.view(e.shape)

    def close(self) -> None:
        # Views into the map may still be alive; let the GC unmap when they die.
        self._mm = None


@dataclass
class Checkpoint:
    """A checkpoint opened lazily: names, dtypes and shapes now, tensor data on demand."""

    path: Path
    format: str  # "safetensors" | "sharded" | "hf" | "torch"
    files: list[Path]
    entries: dict[str, TensorEntry] = field(default_factory=dict)
    config_path: Path | None = None
    _files: dict[Path, SafetensorsFile] = field(default_factory=dict, repr=False)
    _torch_sd: dict | None = field(default=None, repr=False)

    @property
    def n_tensors(self) -> int:
        return len(self.entries) if self._torch_sd is None else len(self._torch_sd)

    @property
    def nbytes(self) -> int:
        if self._torch_sd is not None:
            return sum(t.numel() * t.element_size() for t in self._torch_sd.values() if hasattr(t, "numel"))
        return sum(e.nbytes for e in self.entries.values())

    def names(self) -> list[str]:
        return list(self._torch_sd) if self._torch_sd is not None else list(self.entries)

    def tensor(self, name: str) -> torch.Tensor:
        if self._torch_sd is not None:
            return self._torch_sd[name]
        e = self.entries[name]
        return self._files[e.file].tensor(name)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Tensors one at a time, in file then offset order (sequential reads)."""
        if self._torch_sd is not None:
            yield from self._torch_sd.items()
            return
        for e in sorted(self.entries.values(), key=lambda e: (str(e.file), e.begin)):
            yield e.name, self._files[e.file].tensor(e.name)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: self.tensor(n) for n in self.names()}

    def describe(self) -> dict:
        return {"path": str(self.path), "format": self.format, "n_tensors": self.n_tensors, "bytes": self.nbytes}


def _add_file(ck: Checkpoint, f: Path, only: set[str] | None = None) -> None:
    st = SafetensorsFile(f)
    ck._files[f] = st
    for name, e in st.entries.items():
        if only is not None and name not in only:
            continue
        if name in ck.entries:
            raise BadInput(f"tensor {name!r} appears in both {ck.entries[name].file.name} and {f.name}; fix the shards")
        ck.entries[name] = e


def _open_index(index: Path, fmt: str) -> Checkpoint:
    try:
        data = json.loads(index.read_text())
        weight_map = data["weight_map"]
        assert isinstance(weight_map, dict)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, AssertionError, TypeError):
        raise BadInput(f"{index}: not a valid safetensors index (expected a JSON object with 'weight_map')") from None
    shards: dict[Path, set[str]] = {}
    for name, fname in weight_map.items():
        shards.setdefault(index.parent / str(fname), set()).add(name)
    ck = Checkpoint(index, fmt, sorted(shards))
    for shard, names in sorted(shards.items()):
        if not shard.is_file():
            raise BadInput(f"{index}: shard {shard.name} named in weight_map is missing; download or restore it")
        _add_file(ck, shard, names)
        absent = names - set(ck._files[shard].entries)
        if absent:
            raise BadInput(f"{index}: {len(absent)} tensors mapped to {shard.name} are not in it (e.g. {sorted(absent)[0]!r})")
    return ck


def _open_torch(path: Path) -> Checkpoint:
    import pickle

    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadInput(
            f"{path}: cannot be loaded with torch.load(weights_only=True) ({msg}); "
            "nanhunter never unpickles arbitrary code: convert it to safetensors"
        ) from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise BadInput(f"{path}: expected a state dict (mapping of names to tensors), got {type(obj).__name__}")
    sd = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    ck = Checkpoint(path, "torch", [path])
    ck._torch_sd = sd
    return ck


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Open any supported checkpoint layout; raises BadInput with a one-line fix otherwise."""
    p = Path(path)
    if not p.exists():
        raise BadInput(f"checkpoint not found: {p}; pass a .safetensors file, a *.safetensors.index.json or a model directory")
    if p.is_dir():
        config = p / "config.json"
        indexes = sorted(p.glob("*.safetensors.index.json"))
        if indexes:
            ck = _open_index(indexes[0], "hf" if config.exists() else "sharded")
        else:
            files = sorted(p.glob("*.safetensors"))
            if not files:
                bins = sorted(p.glob("*.bin")) + sorted(p.glob("*.pt"))
                if len(bins) == 1:
                    ck = _open_torch(bins[0])
                    ck.path, ck.format = p, "hf" if config.exists() else "torch"
                    ck.config_path = config if config.exists() else None
                    return ck
                raise BadInput(f"{p}: no *.safetensors files in this directory; point at a checkpoint file or a model directory")
            ck = Checkpoint(p, "hf" if config.exists() else "safetensors", files)
            for f in files:
                _add_file(ck, f)
        ck.path = p
        ck.config_path = config if config.exists() else None
        return ck
    name = p.name
    if name.endswith(".index.json"):
        return _open_index(p, "sharded")
    if name.endswith((".pt", ".pth", ".bin", ".ckpt")):
        return _open_torch(p)
    if not name.endswith(".safetensors"):
        # Accept it if it parses as safetensors; otherwise say what we expected.
        try:
            SafetensorsFile(p)
        except BadInput:
            raise BadInput(
                f"{p}: not a recognised checkpoint; expected .safetensors, *.safetensors.index.json, "
                ".pt/.bin or a model directory"
            ) from None
    ck = Checkpoint(p, "safetensors", [p])
    _add_file(ck, p)
    return ck
