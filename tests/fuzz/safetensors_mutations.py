"""Seeded mutations of safetensors files and checkpoint indexes, for the fuzz tests.

A header is kept as a structure (``Obj`` pairs, so keys can repeat; ``Raw`` JSON tokens, so
values Python's json would never write — NaN, 1e400, -0, 5000-digit integers — can be placed
anywhere), mutated, serialised, then optionally damaged as bytes (BOM, UTF-16, flipped bytes,
a wrong length prefix, truncated or extended data).
"""

from __future__ import annotations

import copy
import json
import random
import struct
from dataclasses import dataclass, field


class Raw(str):
    """A JSON token written as is."""


class Obj(list):
    """A JSON object as (key, value) pairs: keys may repeat."""


def dump(v) -> str:
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, Obj):
        return "{" + ",".join(f"{dump(k)}:{dump(x)}" for k, x in v) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(dump(x) for x in v) + "]"
    return json.dumps(v)


TAGS = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
NUMBERS = [
    -1,
    Raw("-0"),
    1.0,
    Raw("1e400"),
    Raw("9" * 5000),
    "8",
    True,
    False,
    None,
    Raw("NaN"),
    Raw("Infinity"),
    Raw("-Infinity"),
    2**64,
    2**64 - 1,
    2**63,
    0,
    1,
    7,
    24,
    Raw("8e0"),
    Raw("1E1"),
    Raw("-9223372036854775809"),
    10**30,
    2**32,
]
DTYPES = [
    *TAGS,
    "F4",
    "F6_E2M3",
    "F8_E8M0",
    "C64",
    "f32",
    "F12",
    "",
    5,
    None,
    [],
    Obj([("F32", None)]),
    Obj([("F32", 1)]),
    Obj([("F32", None), ("F16", None)]),
]
ODD_VALUES = [
    None,
    True,
    3,
    -2,
    1e300,
    Raw("1e400"),
    "s",
    Raw('"\\udc00"'),
    Raw('"\\ud83d\\ude00"'),
    [],
    Obj(),
    [[[]]],
    Obj([("dtype", "F32"), ("shape", [1]), ("data_offsets", [0, 4])]),
    "\x1b[2J<script>",
]


def nested(depth: int):
    v: object = []
    for _ in range(depth - 1):
        v = [v]
    return v


@dataclass
class Case:
    """One mutated file: its bytes, and what was done to it."""

    data: bytes
    steps: list[str] = field(default_factory=list)


def base_header(rng: random.Random) -> tuple[Obj, bytes]:
    """A valid header of 1-5 tensors (assorted dtypes, an empty one sometimes) and its data,
    with a NaN or Inf planted in some float tensors."""
    pairs: list = []
    if rng.random() < 0.6:
        pairs.append(("__metadata__", Obj([("format", "pt"), ("note", "x")])))
    data = bytearray()
    for i in range(rng.randint(1, 5)):
        tag = rng.choice(list(TAGS))
        shape = [rng.randint(0 if rng.random() < 0.1 else 1, 4) for _ in range(rng.randint(0, 3))]
        n = 1
        for d in shape:
            n *= d
        nbytes = n * TAGS[tag]
        chunk = bytearray(rng.randbytes(nbytes)) if nbytes else bytearray()
        if tag == "F32" and n:
            struct.pack_into("<f", chunk, 0, rng.choice([1.5, float("nan"), float("inf"), -2.0]))
        pairs.append(
            (
                f"layer.{i}.w",
                Obj([("dtype", tag), ("shape", shape), ("data_offsets", [len(data), len(data) + nbytes])]),
            )
        )
        data += chunk
    rng.shuffle(pairs)
    return Obj(pairs), bytes(data)


def _entries(h: Obj) -> list[tuple[int, Obj]]:
    return [(i, v) for i, (k, v) in enumerate(h) if k != "__metadata__" and isinstance(v, Obj)]


def _field_index(e: Obj, name: str) -> int | None:
    return next((i for i, (k, _) in enumerate(e) if k == name), None)


def mutate_structure(h: Obj, rng: random.Random, steps: list[str]) -> None:
    ents = _entries(h)
    op = rng.randrange(14)
    if not ents:
        op = 13
    if op in (0, 1):  # a number in an offset or a shape
        i, e = rng.choice(ents)
        key = rng.choice(["data_offsets", "shape"])
        j = _field_index(e, key)
        if j is not None and isinstance(e[j][1], list) and e[j][1]:
            vals = list(e[j][1])
            p = rng.randrange(len(vals))
            orig = vals[p]
            vals[p] = (
                rng.choice(NUMBERS)
                if rng.random() < 0.6 or not isinstance(orig, int)
                else orig + rng.choice([-8, -4, -1, 1, 2, 4, 8])
            )
            e[j] = (key, vals)
            steps.append(f"{key}[{p}]={dump(vals[p])[:20]}")
    elif op == 2:  # the dtype
        i, e = rng.choice(ents)
        j = _field_index(e, "dtype")
        if j is not None:
            e[j] = ("dtype", rng.choice(DTYPES))
            steps.append(f"dtype={dump(e[j][1])}")
    elif op == 3:  # a tensor name given twice
        i, e = rng.choice(ents)
        twin = copy.deepcopy(e)
        h.insert(rng.randrange(len(h) + 1), (h[i][0], twin))
        steps.append("duplicate tensor")
    elif op == 4:  # __metadata__ given twice, or not a str->str map
        if rng.random() < 0.5:
            h.append(("__metadata__", Obj([("a", "b")])))
            steps.append("duplicate __metadata__")
        else:
            h.insert(
                0,
                (
                    "__metadata__",
                    rng.choice(
                        [
                            Obj([("k", rng.choice(ODD_VALUES))]),
                            [],
                            "x",
                            3,
                            None,
                            Obj([("k", "1"), ("k", "2")]),
                        ]
                    ),
                ),
            )
            steps.append("odd __metadata__")
    elif op == 5 and all(e for _, e in ents):  # a known field given twice
        i, e = rng.choice(ents)
        k, v = rng.choice(list(e))
        e.append((k, copy.deepcopy(v)))
        steps.append(f"field {k} twice")
    elif op == 6 and all(e for _, e in ents):  # a field dropped
        i, e = rng.choice(ents)
        del e[rng.randrange(len(e))]
        steps.append("field dropped")
    elif op == 7:  # an extra field holding anything, nested up to past serde's limit
        i, e = rng.choice(ents)
        v = nested(rng.choice([1, 5, 125, 126, 127, 300])) if rng.random() < 0.3 else rng.choice(ODD_VALUES)
        e.insert(rng.randrange(len(e) + 1), (rng.choice(["extra", "x", "dtype2"]), v))
        steps.append("extra field")
    elif op == 8:  # the entry replaced
        i, _ = rng.choice(ents)
        h[i] = (h[i][0], rng.choice([["F32", [1], [0, 4]], None, 7, "F32", [1, 2, 3, 4], Obj()]))
        steps.append("entry replaced")
    elif op == 9:  # the shape grows a dimension, loses one, or gets a huge one
        i, e = rng.choice(ents)
        j = _field_index(e, "shape")
        if j is not None and isinstance(e[j][1], list):
            shape = list(e[j][1])
            r = rng.random()
            if r < 0.3:
                shape.append(rng.choice([0, 1, 2, 2**40, 2**64 - 1, 2**63]))
            elif r < 0.6 and shape:
                shape.pop()
            else:
                shape.insert(0, rng.choice([2**31, 2**62, 0]))
            e[j] = ("shape", shape)
            steps.append(f"shape={shape}")
    elif op == 10 and len(ents) > 1:  # offsets swapped between two tensors
        (i1, e1), (i2, e2) = rng.sample(ents, 2)
        j1, j2 = _field_index(e1, "data_offsets"), _field_index(e2, "data_offsets")
        if j1 is not None and j2 is not None:
            e1[j1], e2[j2] = ("data_offsets", e2[j2][1]), ("data_offsets", e1[j1][1])
            steps.append("offsets swapped")
    elif op == 11:  # a tensor name with control characters, markup, brackets, a lone surrogate
        i, _ = rng.choice(ents)
        name = rng.choice(
            ["\x1b[2J\x1b]0;pwn\x07", "<script>x</script>", "a[[[{", Raw('"\\ud800"'), "", "a\x00b"]
        )
        h[i] = (name, h[i][1])
        steps.append("odd name")
    elif op == 12:  # serde's list form of an entry
        i, e = rng.choice(ents)
        d = dict(e)
        if all(k in d for k in ("dtype", "shape", "data_offsets")):
            h[i] = (h[i][0], [d["dtype"], d["shape"], d["data_offsets"]])
            steps.append("list-form entry")
    else:  # the whole header replaced
        h[:] = rng.choice([Obj(), Obj([("__metadata__", None)]), Obj([("a", nested(200))])])
        steps.append("header replaced")


def encode(text: str, data: bytes, rng: random.Random, steps: list[str]) -> bytes:
    """Serialised header + data, then damaged as bytes now and then."""
    raw = text.encode("utf-8", "surrogatepass")
    r = rng.random()
    if r < 0.04:
        raw = b"\xef\xbb\xbf" + raw
        steps.append("BOM")
    elif r < 0.07:
        raw = text.encode("utf-16", "surrogatepass")
        steps.append("UTF-16")
    elif r < 0.12:
        raw = (
            rng.choice([b" ", b"\t", b"\n", b"\r", b"\x0c", b"\x00"])
            + raw
            + rng.choice([b"", b"  ", b"x", b"\x00"])
        )
        steps.append("padding")
    elif r < 0.18 and raw:
        p = rng.randrange(len(raw))
        raw = raw[:p] + bytes([rng.randrange(256)]) + raw[p + 1 :]
        steps.append("byte flipped")
    elif r < 0.21:
        raw = raw[: rng.randrange(len(raw) + 1)]
        steps.append("header cut")
    n = len(raw)
    r = rng.random()
    if r < 0.05:
        n = rng.choice([0, n + 1, n - 1, 100_000_001, 2**63, 2**64 - 1])
        steps.append(f"length prefix {n}")
    r = rng.random()
    if r < 0.05:
        data = data[: rng.randrange(len(data) + 1)]
        steps.append("data cut")
    elif r < 0.1:
        data = data + rng.randbytes(rng.choice([1, 4, 8]))
        steps.append("data extended")
    elif r < 0.25 and data:
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        data = bytes(b)
        steps.append("data bytes flipped")
    return struct.pack("<Q", n) + raw + data


def mutated_file(rng: random.Random) -> Case:
    h, data = base_header(rng)
    steps: list[str] = []
    for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
        mutate_structure(h, rng, steps)
    return Case(encode(dump(h), data, rng, steps), steps)


def duplicate_tensor_names(header_bytes: bytes) -> bool:
    """Whether the top-level object names a tensor twice (the one refusal the reference skips)."""
    calls: list = []
    try:
        json.loads(header_bytes.decode("utf-8"), object_pairs_hook=lambda p: calls.append(p) or dict(p))
    except Exception:
        return False
    names = [k for k, _ in calls[-1] if k != "__metadata__"] if calls else []
    return len(names) != len(set(names))


HOSTILE_SHARDS = [
    "../outside/secret.safetensors",
    "/etc/passwd",
    "ABSOLUTE",
    "link.safetensors",
    "sub/../../outside/secret.safetensors",
    "./../outside/secret.safetensors",
    "..",
    "/",
    "sub/..",
    "linkdir/secret.safetensors",
]
OTHER_SHARDS = [
    "missing.safetensors",
    "shard-2.safetensors",
    "./shard-1.safetensors",
    "",
    "shard-1.safetensors\x00x",
    5,
    None,
    {"x": 1},
    ["shard-1.safetensors"],
]


def mutated_index(rng: random.Random, secret: str) -> tuple[str, bool]:
    """An index's JSON text for shards shard-1 (tensor "w") and shard-2 (tensor "v"), and
    whether it names a shard outside the directory (must be refused)."""
    wm: list = [("w", "shard-1.safetensors"), ("v", "shard-2.safetensors")]
    hostile = False
    r = rng.random()
    if r < 0.55:
        name = rng.choice(HOSTILE_SHARDS)
        wm.append((secret, name))
        hostile = True
    elif r < 0.8:
        wm[rng.randrange(2)] = (wm[0][0], rng.choice(OTHER_SHARDS))
    elif r < 0.9:
        wm.append(("w", "shard-1.safetensors"))  # a tensor listed twice
    text = dump(Obj([("metadata", Obj()), ("weight_map", Obj(wm))]))
    r = rng.random()
    if r < 0.05:
        text = "\ufeff" + text
    elif r < 0.1:
        text = text[: rng.randrange(len(text))]
    elif r < 0.13:
        text = '{"weight_map": ' + "[" * 5000 + "]" * 5000 + "}"
        hostile = False
    return text, hostile
