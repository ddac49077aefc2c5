"""``load.safetensors_file``: one safetensors file opened read-only — the header's refusals as one
line naming the file, entries read right (dtype, shape, byte range), tensors read as owned copies,
and the windowed pieces of the scan as read-only views (holes of a sparse file, unaligned data,
several windows). Every file is real, written in tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.errors import BadInput
from nan_hunter.load import safetensors_file as stf
from nan_hunter.load.safetensors_file import HINT_REGEN, HINT_RESAVE, SafetensorsFile, TensorEntry
from nan_hunter.load.safetensors_header import MAX_HEADER

from .raw_safetensors import write_raw


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(3, 5, generator=g),
        "b.half": torch.randn(7, generator=g).half(),
        "c.bf16": torch.randn(2, 2, 2, generator=g).to(torch.bfloat16),
        "d.ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "e.empty": torch.empty(0, 4),
    }


@pytest.fixture
def saved(tmp_path):
    ts = _tensors()
    p = tmp_path / "model.safetensors"
    save_file(ts, str(p), metadata={"format": "pt"})
    return p, ts


def _header_bytes(header: dict | bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw


def _refusal(path, what: str = "checkpoint") -> str:
    with pytest.raises(BadInput) as ei:
        SafetensorsFile(path, what=what)
    msg = str(ei.value)
    assert "\n" not in msg  # one line
    return msg


# --- the header: what is read ----------------------------------------------------------------------


def test_entries_hold_dtype_shape_and_byte_range_as_written(saved):
    p, ts = saved
    f = SafetensorsFile(p)
    assert set(f.entries) == set(ts)
    assert f.metadata == {"format": "pt"}
    assert f.size == p.stat().st_size
    (n,) = struct.unpack("<Q", p.read_bytes()[:8])
    assert f.data_start == 8 + n
    tags = {"a.weight": "F32", "b.half": "F16", "c.bf16": "BF16", "d.ids": "I64", "e.empty": "F32"}
    for name, t in ts.items():
        e = f.entries[name]
        assert isinstance(e, TensorEntry) and e.name == name and e.file == p
        assert e.dtype == tags[name] and e.shape == tuple(t.shape)
        assert e.numel == t.numel() and e.nbytes == e.end - e.begin == t.numel() * t.element_size()
        assert e.torch_dtype() == t.dtype
    # the byte ranges tile the data section: sorted by offset, no gap, ending at the file's end
    spans = sorted((e.begin, e.end) for e in f.entries.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert f.data_start + spans[-1][1] == f.size


def test_a_file_without_metadata_has_an_empty_metadata_map(tmp_path):
    p = write_raw(tmp_path / "m.safetensors", {"x": ("F32", [2], np.ones(2, "<f4").tobytes())})
    f = SafetensorsFile(p)
    assert f.metadata == {} and list(f.entries) == ["x"]


def test_the_shown_path_and_the_opened_path_can_differ(saved, tmp_path):
    p, ts = saved
    shown = tmp_path / "shown-name.safetensors"  # never created: only ``real`` is opened
    f = SafetensorsFile(shown, real=p)
    assert f.path == shown and f.real == p
    assert f.entries["a.weight"].file == shown
    assert torch.equal(f.read_tensor(f.entries["a.weight"]), ts["a.weight"])


# --- the header: what is refused, in one line ----------------------------------------------------


def test_a_file_shorter_than_the_length_field_is_refused(tmp_path):
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\x01\x02\x03")
    msg = _refusal(p)
    assert msg.startswith(f"{p}: file is 3 bytes, too short") and msg.endswith(HINT_REGEN)


def test_a_header_length_over_the_format_limit_is_refused_before_reading_it(tmp_path):
    p = tmp_path / "huge.safetensors"
    p.write_bytes(struct.pack("<Q", MAX_HEADER + 1) + b"{}")
    msg = _refusal(p)
    assert f"header length {MAX_HEADER + 1} is over the safetensors limit of {MAX_HEADER} bytes" in msg
    p.write_bytes(struct.pack("<Q", 2**64 - 1) + b"{}")  # the largest u64: no allocation attempted
    assert "is over the safetensors limit" in _refusal(p)


def test_a_header_length_past_the_end_of_the_file_is_refused(tmp_path):
    p = tmp_path / "truncated.safetensors"
    p.write_bytes(struct.pack("<Q", 1000) + b'{"a":')
    msg = _refusal(p)
    assert f"header length 1000 does not fit a {p.stat().st_size}-byte file" in msg


def test_a_header_that_is_not_json_is_refused(tmp_path):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(_header_bytes(b'{"a": {"dtype": "F32", "shape": [2], '))
    msg = _refusal(p)
    assert msg.startswith(f"{p}: the header is not valid JSON") and msg.endswith(HINT_REGEN)


def test_overlapping_offsets_are_refused(tmp_path):
    p = tmp_path / "overlap.safetensors"
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    p.write_bytes(_header_bytes(header) + b"\0" * 12)
    assert "data_offsets [4, 12] overlaps the tensor before it" in _refusal(p)


def test_offsets_past_the_data_section_are_refused(tmp_path):
    p = tmp_path / "past.safetensors"
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    p.write_bytes(_header_bytes(header) + b"\0" * 8)  # 16 bytes promised, 8 there
    assert "tensors end at byte 16 but the data section has 8 bytes" in _refusal(p)


def test_a_byte_range_that_does_not_match_dtype_and_shape_is_refused(tmp_path):
    p = tmp_path / "size.safetensors"
    header = {"a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}}
    p.write_bytes(_header_bytes(header) + b"\0" * 8)
    assert "has 8 bytes for shape [3] F16 (6 expected)" in _refusal(p)


def test_a_named_input_file_says_what_it_is_and_how_to_fix_it(tmp_path):
    p = tmp_path / "inputs.safetensors"
    p.write_bytes(b"\0" * 4)
    msg = _refusal(p, what="--inputs")
    assert msg.startswith(f"--inputs {p}: file is 4 bytes") and msg.endswith(HINT_RESAVE)


def test_a_directory_is_refused_as_not_a_regular_file(tmp_path):
    assert "not a regular file" in _refusal(tmp_path)


# --- reading tensors ---------------------------------------------------------------------------------


def test_read_tensor_is_an_owned_writable_copy_equal_to_what_was_saved(saved):
    p, ts = saved
    before = hashlib.sha256(p.read_bytes()).hexdigest()
    f = SafetensorsFile(p)
    for name, t in ts.items():
        got = f.read_tensor(f.entries[name])
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t)
    w = f.read_tensor(f.entries["a.weight"])
    w.fill_(7.0)  # writable, and not the file: a second read still gives the saved values
    assert torch.equal(f.read_tensor(f.entries["a.weight"]), ts["a.weight"])
    assert hashlib.sha256(p.read_bytes()).hexdigest() == before


def test_read_array_gives_numpy_in_the_tags_dtype_with_bf16_as_its_bits(saved):
    p, ts = saved
    f = SafetensorsFile(p)
    a = f.read_array(f.entries["a.weight"])
    assert a.dtype == np.dtype("<f4") and a.shape == (3, 5) and np.array_equal(a, ts["a.weight"].numpy())
    h = f.read_array(f.entries["b.half"])
    assert h.dtype == np.dtype("<f2") and np.array_equal(h, ts["b.half"].numpy())
    b = f.read_array(f.entries["c.bf16"])
    assert b.dtype == np.dtype("<u2") and b.shape == (2, 2, 2)
    assert np.array_equal(b, ts["c.bf16"].view(torch.int16).numpy().view(np.uint16))
    assert f.read_array(f.entries["e.empty"]).shape == (0, 4)


def test_read_bytes_is_clipped_to_the_tensor(saved):
    p, ts = saved
    f = SafetensorsFile(p)
    e = f.entries["d.ids"]
    raw = ts["d.ids"].numpy().tobytes()
    assert f.read_bytes(e, 8, 16).tobytes() == raw[8:24]
    assert f.read_bytes(e, 40, 100).tobytes() == raw[40:]  # past the end: only the tensor's bytes
    assert f.read_bytes(e, -5, 8).tobytes() == raw[:8]
    assert f.read_bytes(e, 999, 8).size == 0


def test_sub_byte_tags_read_as_packed_bytes_and_are_refused_by_torch(tmp_path):
    packed = bytes([0x12, 0x34, 0x56])  # six F4 values, two per byte
    p = write_raw(tmp_path / "f4.safetensors", {"q": ("F4", [6], packed)})
    f = SafetensorsFile(p)
    e = f.entries["q"]
    assert e.nbytes == 3 and e.numel == 6 and e.torch_dtype() is None
    a = f.read_array(e)
    assert a.dtype == np.uint8 and a.shape == (3,) and a.tobytes() == packed
    with pytest.raises(BadInput, match="tensor 'q' has dtype F4, which torch cannot load element-wise"):
        f.read_tensor(e)


def test_a_file_changed_after_its_header_was_read_is_refused(saved):
    p, ts = saved
    f = SafetensorsFile(p)
    e = f.entries["a.weight"]
    save_file({"a.weight": ts["a.weight"] * 2}, str(p))  # replaced by another file
    for read in (lambda: f.read_tensor(e), lambda: f.read_bytes(e, 0, 4), lambda: list(f.pieces([e]))):
        with pytest.raises(BadInput, match="changed since nanhunter read its header"):
            read()


# --- the scan's pieces -----------------------------------------------------------------------------


def _gather(f: SafetensorsFile, e: TensorEntry) -> tuple[np.ndarray, list[tuple[int, int, bool]]]:
    """Tensor ``e`` from its pieces (holes as zeros), and (first, count, was a view) per piece."""
    parts, shape = [], []
    for got, pieces in f.pieces([e]):
        assert got is e
        for first, count, view in pieces:
            shape.append((first, count, view is not None))
            if view is None:
                parts.append(np.zeros(count, stf.NUMPY_DTYPES[e.dtype]))
            else:
                assert not view.flags.writeable
                parts.append(np.array(view))
    return np.concatenate(parts) if parts else np.array([]), shape


def test_pieces_are_read_only_views_that_rebuild_each_tensor(saved):
    p, ts = saved
    f = SafetensorsFile(p)
    order = sorted(f.entries.values(), key=lambda e: e.begin)
    seen = []
    for e, pieces in f.pieces(order):
        seen.append(e.name)
        for _, _, view in pieces:
            with pytest.raises(ValueError):
                view[...] = 0  # the map is PROT_READ: numpy refuses the write
    assert seen == [e.name for e in order]
    a, _ = _gather(f, f.entries["a.weight"])
    assert np.array_equal(a, ts["a.weight"].numpy().ravel())
    b, _ = _gather(f, f.entries["c.bf16"])
    assert np.array_equal(b, ts["c.bf16"].view(torch.int16).numpy().view(np.uint16).ravel())
    empty, shape = _gather(f, f.entries["e.empty"])
    assert empty.size == 0 and shape == []


def test_small_pieces_and_windows_cover_a_tensor_exactly_once(saved, monkeypatch):
    p, ts = saved
    monkeypatch.setattr(stf, "PIECE", 16)  # 4 float32 per piece
    monkeypatch.setattr(stf, "WINDOW", 32)
    f = SafetensorsFile(p)
    got, shape = _gather(f, f.entries["a.weight"])
    assert [(first, count) for first, count, _ in shape] == [(0, 4), (4, 4), (8, 4), (12, 3)]
    assert np.array_equal(got, ts["a.weight"].numpy().ravel())


def test_unaligned_data_reads_right(tmp_path):
    """A header length not padded to 8 leaves float32 data at an odd address: read by copying."""
    vals = np.array([1.5, -2.0, 3.25], "<f4")
    raw = json.dumps({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}).encode() + b" "
    if len(raw) % 4 == 0:
        raw += b" "
    p = tmp_path / "odd.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw)) + raw + vals.tobytes())
    f = SafetensorsFile(p)
    assert f.data_start % 4 != 0
    got, _ = _gather(f, f.entries["x"])
    assert np.array_equal(got, vals)
    assert np.array_equal(f.read_array(f.entries["x"]), vals)


def test_holes_of_a_sparse_file_come_as_none_and_data_as_views(tmp_path, monkeypatch):
    monkeypatch.setattr(stf, "PIECE", 4096)
    n = 64 * 1024  # float32 elements: 256 KiB, most of it never written
    header = json.dumps({"z": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    p = tmp_path / "sparse.safetensors"
    with open(p, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header + np.full(8, 2.0, "<f4").tobytes())
        fh.truncate(8 + len(header) + 4 * n)  # the rest is a hole
    fd = os.open(p, os.O_RDONLY)
    try:
        holes = os.lseek(fd, 0, os.SEEK_HOLE) < os.fstat(fd).st_size
    except (AttributeError, OSError):
        holes = False
    finally:
        os.close(fd)
    if not holes:
        pytest.skip("this file system reports no holes")
    f = SafetensorsFile(p)
    got, shape = _gather(f, f.entries["z"])
    assert shape[0][2] is True  # the written start is data
    assert any(not is_view for _, _, is_view in shape)  # pieces inside the hole are never mapped
    assert got[:8].tolist() == [2.0] * 8 and not got[8:].any()
    assert sum(count for _, count, _ in shape) == n


def test_byte_stripes_hold_whole_stripes(saved, monkeypatch):
    p, ts = saved
    monkeypatch.setattr(stf, "PIECE", 20)
    f = SafetensorsFile(p)
    e = f.entries["d.ids"]  # 48 bytes
    stripes = [(first, np.array(v)) for first, v in f.byte_stripes(e, 6)]
    assert [first for first, _ in stripes] == [0, 18, 36]  # 20 bytes rounded down to 3 stripes of 6
    assert all(len(v) % 6 == 0 for _, v in stripes)
    assert b"".join(v.tobytes() for _, v in stripes) == ts["d.ids"].numpy().tobytes()


def test_bit_tags_come_as_whole_packed_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(stf, "PIECE", 8)
    data = bytes(range(12))  # 16 F6 values: 4 groups of 3 bytes
    p = write_raw(tmp_path / "f6.safetensors", {"q": ("F6_E2M3", [16], data)})
    f = SafetensorsFile(p)
    pieces = []
    for e, ps in f.pieces([f.entries["q"]]):
        assert e.name == "q"
        pieces += [(first, count, np.array(v)) for first, count, v in ps]
    assert [(first, count) for first, count, _ in pieces] == [(0, 6), (6, 6)]  # 8 bytes -> 2 groups each
    assert b"".join(v.tobytes() for _, _, v in pieces) == data
