"""nan_hunter/load/regular_file.py: regular files only, read-only, never blocking; size limits and
UTF-8 checks with one clear line."""

from __future__ import annotations

import os
import stat

import pytest

from nan_hunter.errors import BadInput
from nan_hunter.load.regular_file import (
    is_inside,
    kind_of,
    open_regular,
    read_exact,
    read_regular,
    read_text,
    require_regular,
)


def test_kind_of_names_each_kind():
    assert kind_of(stat.S_IFDIR) == "a directory"
    assert kind_of(stat.S_IFIFO) == "a FIFO (named pipe)"
    assert kind_of(stat.S_IFSOCK) == "a socket"
    assert kind_of(stat.S_IFCHR) == "a character device"
    assert kind_of(stat.S_IFBLK) == "a block device"
    assert kind_of(stat.S_IFLNK) == "not a regular file"


def test_require_regular_refuses_missing_directories_fifos_and_devices(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"abc")
    assert require_regular(f, "--x").st_size == 3
    with pytest.raises(BadInput, match=r"^--x .*missing: not found$"):
        require_regular(tmp_path / "missing", "--x")
    with pytest.raises(
        BadInput, match="is a directory, not a regular file; nanhunter reads regular files only"
    ):
        require_regular(tmp_path, "--x")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(BadInput, match="is a FIFO"):
        require_regular(fifo, "checkpoint")
    with pytest.raises(BadInput, match="is a FIFO"):
        open_regular(fifo, "checkpoint")  # refused before any open: never blocks
    with pytest.raises(BadInput, match="is a character device"):
        require_regular("/dev/null", "--inputs")


def test_a_symlink_to_a_regular_file_is_followed(tmp_path):
    f = tmp_path / "real"
    f.write_bytes(b"xyz")
    link = tmp_path / "link"
    link.symlink_to(f)
    with open_regular(link, "--x") as fh:
        assert fh.read() == b"xyz"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    with pytest.raises(BadInput, match="not found"):
        require_regular(dangling, "--x")


def test_open_regular_is_read_only_and_blocking_after_open(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"0123456789")
    with open_regular(f, "--x") as fh:
        assert os.get_blocking(fh.fileno())
        with pytest.raises(OSError):
            fh.write(b"no")
        assert read_exact(fh, 4) == b"0123" and read_exact(fh, 100) == b"456789" and read_exact(fh, 1) == b""
    assert f.read_bytes() == b"0123456789"


def test_read_regular_and_read_text_limits_and_encoding(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("héllo", encoding="utf-8")
    assert read_regular(f, "--x", limit=6) == "héllo".encode()
    assert read_text(f, "--x", limit=6) == "héllo"
    with pytest.raises(BadInput, match=r"6 bytes, over the 5-byte limit for this file"):
        read_regular(f, "--x", limit=5)
    f.write_bytes(b"ok\xffno")
    with pytest.raises(BadInput, match=r"not UTF-8 text \(invalid byte at offset 2\); save it as UTF-8"):
        read_text(f, "--config", limit=100)


def test_is_inside(tmp_path):
    root = tmp_path.resolve()
    assert is_inside(root, root) and is_inside(root / "a" / "b", root)
    assert not is_inside(root.parent, root) and not is_inside(root.parent / (root.name + "x"), root)
