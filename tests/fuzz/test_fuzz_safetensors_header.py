"""Differential fuzz: nanhunter's verdict on mutated safetensors files is the reference's.

Seeded and bounded (``N_CASES`` files, a few seconds). For each mutated file both parsers say
accept or refuse; they must agree, except where nanhunter is deliberately stricter (a tensor
name given twice). A refusal is one line naming the file.
"""

from __future__ import annotations

import random
import struct
import time

import safetensors
from safetensors_mutations import duplicate_tensor_names, mutated_file

from nan_hunter.errors import BadInput
from nan_hunter.load.checkpoint import open_safetensors

SEED = 19
N_CASES = 1500


def reference_accepts(path) -> bool:
    try:
        with safetensors.safe_open(str(path), "pt") as f:
            list(f.keys())
        return True
    except Exception:
        return False


def test_verdicts_match_the_reference_parser(tmp_path):
    rng = random.Random(SEED)
    p = tmp_path / "case.safetensors"
    disagreements, accepted, stricter = [], 0, 0
    start = time.monotonic()
    for i in range(N_CASES):
        case = mutated_file(rng)
        p.write_bytes(case.data)
        ref = reference_accepts(p)
        try:
            open_safetensors(p)
            ours, msg = True, ""
        except BadInput as e:
            ours, msg = False, str(e)
            assert "\n" not in msg and str(p) in msg, (i, case.steps, msg)
        n = struct.unpack("<Q", case.data[:8])[0] if len(case.data) >= 8 else 0
        if ref and not ours and duplicate_tensor_names(case.data[8 : 8 + n]):
            stricter += 1  # nanhunter refuses a repeated tensor name; the reference keeps the last
            assert "given twice" in msg, msg
            continue
        accepted += ours
        if ours != ref:
            disagreements.append((i, case.steps, ref, msg))
    assert not disagreements, disagreements[:10]
    # the mutations reach both sides of the line, and the whole run stays bounded
    assert 0.15 * N_CASES < accepted < 0.85 * N_CASES, accepted
    assert stricter > 0
    assert time.monotonic() - start < 90
