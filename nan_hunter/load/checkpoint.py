"""Checkpoints: a ``.safetensors`` file, a sharded index, a Hugging Face directory, or ``.pt``/``.bin``.

What the loader promises:
- it opens regular files only, read-only, and never blocks (``regular_file``);
- it reads nothing outside a checkpoint directory: shard names from an index and the files of a
  directory must resolve, symlinks followed, inside it (or, for a Hugging Face hub cache
  snapshot, inside that repository's ``blobs/``), else exit 2;
- safetensors headers are validated as the reference parser validates them
  (``safetensors_header``), and data is read through bounded read-only windows
  (``safetensors_file``), so any size scans with flat memory;
- ``.pt``/``.bin`` go only through ``torch.load(weights_only=True)`` (``torch_checkpoint``).

What the weights scan and the quantized checks read (``scan_items``, ``array``, ``read_bytes``,
``byte_stripes``) comes as numpy arrays: a safetensors or GGUF checkpoint is scanned without
importing torch. ``tensor`` and ``state_dict`` (building a model) give torch tensors.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import name_of
from ..errors import BadInput
from . import bounded_json
from . import safetensors_file as sf
from .bit_dtypes import BIT_TAGS, TORCH_TO_TAG
from .float_bits import FLOATS
from .gguf_file import GgufFile
from .regular_file import is_inside, kind_of, open_regular, read_regular, require_regular
from .safetensors_file import SafetensorsFile, TensorEntry
from .safetensors_header import TORCH_DTYPES, show
from .torch_checkpoint import load_torch_file

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["Checkpoint", "TensorEntry", "ScanItem", "open_checkpoint", "open_safetensors", "member"]

MAX_INDEX_BYTES = 64 << 20
NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits on a path component and a whole path, in bytes
MAX_TENSORS = 1_000_000  # per checkpoint, all shards together
#: Files of a directory checkpoint that nanhunter or transformers may open, by suffix.
READ_SUFFIXES = (
    ".json",
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".txt",
    ".model",
    ".jinja",
    ".tiktoken",
)
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


@dataclass
class ScanItem:
    """One tensor as the weights scan streams it: metadata now, data in pieces.

    ``pieces`` yields ``(first element, count, 1-D read-only numpy view or None)``; None is a run of
    zeros (a hole of a sparse file). It is None when the dtype is not scanned.
    """

    name: str
    dtype: str  # torch's name ("float32"), or the safetensors tag when torch has none
    tag: str | None  # the float tag the pieces are read as (F64, F32, F16, BF16: ``float_bits``), else None
    shape: list[int]
    numel: int
    nbytes: int
    pieces: Iterator[tuple[int, int, Any]] | None
    #: the safetensors tag when the tensor is checked from its bits (``bit_dtypes``): ``pieces`` then
    #: yields raw bytes ``(first byte, byte count, uint8 view or None)``
    bits: str | None = None
    skip: str | None = None  # why its dtype is not scanned (None: it is)


def tag_skip_reason(tag: str) -> str | None:
    """Why a safetensors tag is not scanned element-wise, as the report says it (None: it is)."""
    if tag in FLOATS or tag in BIT_TAGS:
        return None
    name = TORCH_DTYPES.get(tag)
    if name is None:
        return f"dtype {tag} is not scanned (torch cannot hold it element-wise)"
    if tag == "C64":
        return f"dtype {name} is not scanned (complex)"
    return "not floating point"


def member(root: Path, name: object, where: str, kind: str = "file") -> tuple[Path, Path]:
    """``name`` (a shard name from an index, or a directory entry) as a file of checkpoint
    directory ``root``: (the path shown to the user, the resolved path to open).

    Exit 2 when it is not a relative name, climbs out with ``..``, or resolves (symlinks
    followed) outside ``root`` — except into the ``blobs/`` of a hub-cache snapshot.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise BadInput(f"{where}: {kind} {show(name)} is not a file name")
    what = f"{where}: {kind} {show(name)}"
    try:
        encoded = os.fsencode(name)
    except UnicodeError:  # a lone surrogate from JSON escapes: no file can have that name
        raise BadInput(f"{what} is not a valid file name (invalid Unicode)") from None
    if any(len(part) > NAME_MAX for part in encoded.split(b"/")) or len(encoded) >= PATH_MAX:
        raise BadInput(
            f"{what} is too long for a file name ({len(encoded)} bytes; at most {NAME_MAX} per "
            f"component, {PATH_MAX} in all); fix the index"
        )
    if name.startswith(("/", "\\")) or PurePosixPath(name).is_absolute() or os.path.isabs(name):
        raise BadInput(
            f"{what} is an absolute path; nanhunter reads nothing outside the checkpoint directory {root}"
        )
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        raise BadInput(
            f"{what} climbs out of the checkpoint directory with '..'; nanhunter reads nothing outside it"
        )
    shown = root / name
    try:
        real_root = root.resolve()
        real = shown.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise BadInput(f"{what} cannot be resolved ({e}); fix the links") from None
    if is_inside(real, real_root):
        return shown, real
    snapshots = real_root.parent
    if snapshots.name == "snapshots" and is_inside(real, snapshots.parent / "blobs"):
        return shown, real  # the Hugging Face hub cache: snapshot files link to ../../blobs/<hash>
    raise BadInput(
        f"{what} resolves (through a symlink) to {real}, outside the checkpoint directory {root}; "
        "nanhunter reads nothing outside it"
    )


@dataclass
class Checkpoint:
    """A checkpoint opened lazily: names, dtypes and shapes now, tensor data on demand."""

    path: Path
    format: str  # "safetensors" | "sharded" | "hf" | "torch" | "gguf"
    files: list[Path]
    entries: dict[str, TensorEntry] = field(default_factory=dict)
    config_path: Path | None = None
    _files: dict[Path, SafetensorsFile] = field(default_factory=dict, repr=False)
    _torch_sd: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def n_tensors(self) -> int:
        return len(self.entries) if self._torch_sd is None else len(self._torch_sd)

    @property
    def nbytes(self) -> int:
        if self._torch_sd is not None:
            return sum(t.numel() * t.element_size() for t in self._torch_sd.values())
        return sum(e.nbytes for e in self.entries.values())

    def names(self) -> list[str]:
        return list(self._torch_sd) if self._torch_sd is not None else list(self.entries)

    def entry(self, name: str) -> TensorEntry | None:
        """The safetensors entry of ``name`` (None for a torch checkpoint)."""
        return self.entries.get(name) if self._torch_sd is None else None

    def tensor(self, name: str) -> torch.Tensor:
        """Tensor ``name``, safe to modify: an owned copy (the file is never touched)."""
        if self._torch_sd is not None:
            return self._torch_sd[name]
        e = self.entries[name]
        return self._files[e.file].read_tensor(e)

    def tag_of(self, name: str) -> str:
        """The safetensors dtype tag of ``name`` (a torch checkpoint's dtype mapped to its tag; its name
        when no tag has it)."""
        e = self.entry(name)
        if e is not None:
            return e.dtype
        dt = str(self.tensor(name).dtype).removeprefix("torch.")
        return next((k for k, v in TORCH_DTYPES.items() if v == dt), dt)

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as an owned numpy array in its tag's ``NUMPY_DTYPES`` dtype (BF16 and the
        1-byte floats as their raw bits, packed sub-byte tags as bytes): what the quantized checks read."""
        if self._torch_sd is not None:
            return _torch_array(self._torch_sd[name]).copy()
        e = self.entries[name]
        return self._files[e.file].read_array(e)

    def _ordered(self) -> Iterator[tuple[SafetensorsFile, list[TensorEntry]]]:
        by_file: dict[Path, list[TensorEntry]] = {}
        for e in self.entries.values():
            by_file.setdefault(e.file, []).append(e)
        for f in sorted(by_file, key=str):
            yield self._files[f], sorted(by_file[f], key=lambda e: e.begin)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Tensors one at a time, in file then offset order, each an owned copy."""
        if self._torch_sd is not None:
            yield from self._torch_sd.items()
            return
        for st, entries in self._ordered():
            for e in entries:
                yield e.name, st.read_tensor(e)

    def scan_items(self) -> Iterator[ScanItem]:
        """Every tensor for the weights scan, streamed in bounded read-only numpy pieces."""
        if self._torch_sd is not None:
            yield from _torch_items(self._torch_sd)
            return
        for st, entries in self._ordered():
            for e, pieces in st.pieces(entries):
                name = TORCH_DTYPES.get(e.dtype, e.dtype)
                bits = e.dtype if e.dtype in BIT_TAGS else None
                skip = tag_skip_reason(e.dtype)
                yield ScanItem(
                    e.name,
                    name,
                    e.dtype if e.dtype in FLOATS else None,
                    list(e.shape),
                    e.numel,
                    e.nbytes,
                    None if skip else pieces,
                    bits,
                    skip,
                )

    def byte_stripes(self, name: str, stripe_bytes: int) -> Iterator[tuple[int, Any]]:
        """Tensor ``name``'s bytes, read only, in pieces of whole ``stripe_bytes`` stripes:
        ``(first byte, 1-D numpy uint8 view, or None for a run of zeros)``; memory stays one window."""
        if self._torch_sd is not None:
            raw = _torch_bytes(self._torch_sd[name])
            step = max(stripe_bytes, sf.PIECE - sf.PIECE % max(1, stripe_bytes))
            for s in range(0, raw.size, step):
                yield s, raw[s : s + step]
            return
        e = self.entries[name]
        yield from self._files[e.file].byte_stripes(e, stripe_bytes)

    def read_bytes(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        """Bytes ``offset .. offset + nbytes`` of tensor ``name`` as an owned numpy uint8 array (bounded read)."""
        if self._torch_sd is not None:
            return _torch_bytes(self._torch_sd[name])[max(0, offset) : max(0, offset + nbytes)].copy()
        e = self.entries[name]
        return self._files[e.file].read_bytes(e, offset, nbytes)

    def nbytes_of(self, name: str) -> int:
        """Bytes tensor ``name`` occupies."""
        e = self.entry(name)
        if e is not None:
            return e.nbytes
        t = self.tensor(name)
        return t.numel() * t.element_size()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: self.tensor(n) for n in self.names()}

    def describe(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": self.format,
            "n_tensors": self.n_tensors,
            "bytes": self.nbytes,
        }


#: torch dtype name → the float tag the scan reads it as (``float_bits``)
_TORCH_FLOATS = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def _torch_array(t: torch.Tensor) -> np.ndarray:
    """A torch checkpoint's CPU tensor as numpy, sharing its memory, in the ``NUMPY_DTYPES`` form of its
    tag (bfloat16 as uint16 bits, fp8 as bytes). Only torch checkpoints come here: torch is loaded."""
    import torch

    t = t.detach().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if name == "bfloat16":
        return t.view(torch.int16).numpy().view(np.uint16)
    if name in TORCH_TO_TAG:
        return t.view(torch.uint8).numpy()
    return t.numpy()


def _torch_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of a torch checkpoint's tensor, flat, sharing its memory."""
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def _torch_skip_reason(dtype: torch.dtype, name: str) -> str | None:
    """Why a torch checkpoint's dtype is not scanned element-wise (None: it is)."""

    if dtype.is_complex:
        return f"dtype {name} is not scanned (complex)"
    if not dtype.is_floating_point:
        return "not floating point"
    if name_of(dtype) is None:
        return f"dtype {name} is not scanned"
    return None


def _torch_items(sd: dict[str, torch.Tensor]) -> Iterator[ScanItem]:
    """A torch checkpoint's tensors for the weights scan: numpy views of their memory, as a safetensors
    file of the same tags would give them."""

    for name, t in sd.items():
        dname = str(t.dtype).removeprefix("torch.")
        tag = TORCH_TO_TAG.get(dname)
        if tag is not None:  # checked from its bits, as a safetensors tensor of that tag
            raw = _torch_bytes(t)
            pieces = (
                (s, min(sf.PIECE, raw.size - s), raw[s : s + sf.PIECE]) for s in range(0, raw.size, sf.PIECE)
            )
            yield ScanItem(name, dname, None, list(t.shape), t.numel(), raw.size, pieces, tag)
            continue
        nbytes = t.numel() * t.element_size()
        ftag = _TORCH_FLOATS.get(dname)
        skip = None if ftag else _torch_skip_reason(t.dtype, dname)
        floats: Iterator[tuple[int, int, np.ndarray]] | None = None
        if ftag and t.numel():
            flat = _torch_array(t).reshape(-1)
            step = max(1, sf.PIECE // max(1, t.element_size()))
            floats = ((s, min(step, flat.size - s), flat[s : s + step]) for s in range(0, flat.size, step))
        yield ScanItem(name, dname, ftag, list(t.shape), t.numel(), nbytes, floats, None, skip)


def _add_file(ck: Checkpoint, shown: Path, real: Path, only: set[str] | None = None) -> SafetensorsFile:
    st = SafetensorsFile(shown, real)
    ck._files[shown] = st
    for name, e in st.entries.items():
        if only is not None and name not in only:
            continue
        if name in ck.entries:
            raise BadInput(
                f"tensor {show(name)} appears in both {show(ck.entries[name].file.name)} and {show(shown.name)}; "
                "fix the shards"
            )
        ck.entries[name] = e
    if len(ck.entries) > MAX_TENSORS:
        raise BadInput(f"{ck.path}: more than {MAX_TENSORS:,} tensors, nanhunter's limit per checkpoint")
    return st


def read_index(index: Path, real: Path | None = None) -> dict[str, set[str]]:
    """The index's weight_map as shard name → tensor names; every shard name confined to the
    directory (``member``). The one parser of a sharded index: the loader and the output check
    (``command_inputs.checkpoint_files``, which must know the shards before any work) both read it
    here, so a malformed index is refused once, in one line (BadInput), wherever it is met first.
    ``real``: the index's resolved path (default: ``index`` itself)."""
    raw = read_regular(real if real is not None else index, "index", MAX_INDEX_BYTES)
    data = bounded_json.loads(raw, str(index), unique_keys=True)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise BadInput(
            f"{index}: not a valid safetensors index (expected a JSON object with a non-empty 'weight_map')"
        )
    shards: dict[str, set[str]] = {}
    for name, fname in weight_map.items():
        if not isinstance(fname, str):
            raise BadInput(
                f"{index}: weight_map gives {show(fname)} for tensor {show(name)}, not a file name; "
                "fix the index"
            )
        shards.setdefault(fname, set()).add(name)
    for fname in shards:
        member(index.parent, fname, str(index), "weight_map shard")
    return shards


def _open_index(index: Path, real: Path, fmt: str) -> Checkpoint:
    shards = read_index(index, real)
    root = index.parent
    ck = Checkpoint(index, fmt, [root / f for f in sorted(shards)])
    for fname in sorted(shards):
        shown, real_shard = member(root, fname, str(index), "weight_map shard")
        try:
            missing = not real_shard.exists()
        except OSError as e:
            raise BadInput(
                f"{index}: shard {show(fname)} named in weight_map cannot be opened ({e.strerror})"
            ) from None
        if missing:
            raise BadInput(
                f"{index}: shard {show(fname)} named in weight_map is missing; download or restore it"
            )
        names = shards[fname]
        st = _add_file(ck, shown, real_shard, names)
        absent = names - set(st.entries)
        if absent:
            raise BadInput(
                f"{index}: {len(absent)} tensors mapped to {show(fname)} are not in it "
                f"(e.g. {show(sorted(absent)[0])})"
            )
    return ck


def _open_torch(shown: Path, real: Path) -> Checkpoint:
    ck = Checkpoint(shown, "torch", [shown])
    ck._torch_sd = load_torch_file(shown, real)
    if len(ck._torch_sd) > MAX_TENSORS:
        raise BadInput(f"{shown}: more than {MAX_TENSORS:,} tensors, nanhunter's limit per checkpoint")
    return ck


def _check_directory(root: Path) -> None:
    """Every file of ``root`` that nanhunter or transformers may open must be a regular file
    inside it: a FIFO would block, a symlink out would read someone else's file."""
    try:
        names = sorted(os.listdir(root))
    except OSError as e:
        raise BadInput(f"checkpoint {root}: cannot list it ({e.strerror})") from None
    for name in names:
        if not name.endswith(READ_SUFFIXES):
            continue
        shown, real = member(root, name, f"checkpoint {root}")
        try:
            st = os.stat(real)
        except OSError:
            continue  # a dangling link: reported if something needs that file
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(
                f"checkpoint {root}: {name} is {kind_of(st.st_mode)}, not a regular file; "
                "nanhunter reads regular files only"
            )


def _open_directory(p: Path) -> Checkpoint:
    _check_directory(p)
    if (p / "capsule.json").is_file() and not (p / "config.json").exists():
        raise BadInput(
            f"{p} is a nanhunter capsule (one failing training step): replay it with `nanhunter scan {p}`; "
            "this command takes a model checkpoint"
        )
    config = p / "config.json"
    has_config = config.exists()
    indexes = sorted(p.glob("*.safetensors.index.json"))
    for idx in indexes:  # transformers may read any of them: every one must stay inside
        read_index(idx, member(p, idx.name, f"checkpoint {p}")[1])
    if indexes:
        preferred = [i for i in indexes if i.name == "model.safetensors.index.json"] or indexes
        ck = _open_index(
            preferred[0],
            member(p, preferred[0].name, f"checkpoint {p}")[1],
            "hf" if has_config else "sharded",
        )
    else:
        files = sorted(p.glob("*.safetensors"))
        if not files:
            bins = sorted(f for f in p.iterdir() if f.name.endswith(_TORCH_SUFFIXES))
            if len(bins) == 1:
                ck = _open_torch(*member(p, bins[0].name, f"checkpoint {p}"))
                ck.path, ck.format = p, "hf" if has_config else "torch"
                ck.config_path = config if has_config else None
                return ck
            raise BadInput(
                f"{p}: no *.safetensors files in this directory; point at a checkpoint file or a model directory"
            )
        ck = Checkpoint(p, "hf" if has_config else "safetensors", files)
        for f in files:
            _add_file(ck, *member(p, f.name, f"checkpoint {p}"))
    ck.path = p
    ck.config_path = config if has_config else None
    return ck


def open_safetensors(path: str | os.PathLike[str], what: str = "checkpoint") -> Checkpoint:
    """A single safetensors file (a checkpoint, or an ``--inputs`` file) through the strict parser."""
    p = Path(path)
    ck = Checkpoint(p, "safetensors", [p])
    st = SafetensorsFile(p, p, what)
    ck._files[p] = st
    ck.entries.update(st.entries)
    return ck


def open_gguf(p: Path) -> Checkpoint:
    """A GGUF file (llama.cpp) through the strict parser (``gguf_file``): scanned weights-only."""

    ck = Checkpoint(p, "gguf", [p])
    st = GgufFile(p, p)
    ck._files[p] = st
    ck.entries.update(st.entries)
    return ck


def _has_gguf_magic(p: Path) -> bool:

    try:
        with open_regular(p, "checkpoint") as f:
            return f.read(4) == b"GGUF"
    except (BadInput, OSError):
        return False


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Open any supported checkpoint layout; raises BadInput with a one-line fix otherwise."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise BadInput(
            f"checkpoint not found: {p}; pass a .safetensors, .gguf or .pt/.bin file, a "
            "*.safetensors.index.json, or a model or capsule directory"
        ) from None
    except OSError as e:
        raise BadInput(f"checkpoint {p}: cannot read it ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        return _open_directory(p)
    require_regular(p, "checkpoint")
    name = p.name
    if name.endswith(".index.json"):
        return _open_index(p, p, "sharded")
    if name.endswith(_TORCH_SUFFIXES):
        return _open_torch(p, p)
    if name.endswith(".gguf") or _has_gguf_magic(p):
        return open_gguf(p)
    if not name.endswith(".safetensors"):
        try:
            return open_safetensors(p)
        except BadInput:
            raise BadInput(
                f"{p}: not a recognised checkpoint; expected .safetensors, *.safetensors.index.json, "
                ".gguf, .pt/.bin or a model directory"
            ) from None
    return open_safetensors(p)
