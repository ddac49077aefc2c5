"""Safetensors files built from raw bytes, for dtypes torch cannot write (F4, F6, ...)."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def write_raw(
    path: Path, tensors: dict[str, tuple[str, list[int], bytes]], metadata: dict | None = None
) -> Path:
    """``tensors``: name -> (safetensors dtype tag, shape, data bytes), written in the given order."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    data = b""
    for name, (tag, shape, raw) in tensors.items():
        header[name] = {"dtype": tag, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path
