"""Opening the user's files: regular files only, read-only, never blocking.

A FIFO, socket or device handed over as a checkpoint, index, config or data file would make
``open`` or ``read`` wait forever (or read an endless stream). Everything nanhunter reads goes
through here: ``os.stat`` refuses anything that is not a regular file before it is opened, and
the open itself is ``O_RDONLY | O_NONBLOCK`` followed by ``fstat`` on the descriptor, so a file
swapped for a FIFO in between cannot block either. Read-only is the open mode, not a promise.
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path
from typing import BinaryIO

from ..errors import BadInput


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def require_regular(path: str | os.PathLike[str], what: str) -> os.stat_result:
    """``os.stat`` of ``path`` (symlinks followed); exit 2 unless it is an existing regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BadInput(f"{what} {path}: not found") from None
    except OSError as e:
        raise BadInput(f"{what} {path}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise BadInput(
            f"{what} {path}: is {kind_of(st.st_mode)}, not a regular file; nanhunter reads regular files only"
        )
    return st


def open_regular(path: str | os.PathLike[str], what: str) -> io.FileIO:
    """Open a regular file read-only (unbuffered); never blocks on a FIFO or device."""
    st = require_regular(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise BadInput(f"{what} {path}: cannot open it ({e.strerror})") from None
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise BadInput(f"{what} {path}: was replaced while being opened; run again when it is in place")
        os.set_blocking(fd, True)  # a regular file never blocks; plain reads from here on
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def read_exact(f: BinaryIO, n: int) -> bytes:
    """``n`` bytes from ``f`` (reads can come back short; loop), fewer only at end of file."""
    parts = []
    while n > 0:
        b = f.read(min(n, 1 << 30))
        if not b:
            break
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


def read_regular(path: str | os.PathLike[str], what: str, limit: int) -> bytes:
    """The whole of a small regular file; exit 2 when it is over ``limit`` bytes."""
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise BadInput(f"{what} {path}: {size} bytes, over the {limit}-byte limit for this file")
        data = read_exact(f, limit + 1)
    if len(data) > limit:  # grew while being read
        raise BadInput(f"{what} {path}: over the {limit}-byte limit for this file")
    return data


def read_text(path: str | os.PathLike[str], what: str, limit: int) -> str:
    """A small regular file as UTF-8 text; exit 2 naming the byte offset when it is not UTF-8."""
    data = read_regular(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(
            f"{what} {path}: not UTF-8 text (invalid byte at offset {e.start}); save it as UTF-8"
        ) from None


def is_inside(path: Path, root: Path) -> bool:
    """Whether resolved ``path`` is ``root`` or below it (both already resolved)."""
    return path == root or root in path.parents
