"""nan_hunter/load/weights.py: the static weights scan, on in-memory tensors and real files."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.weights import SAMPLE, TensorScan, TensorStatsAccumulator, scan_tensor, scan_weights


def test_counts_and_first_index_of_non_finite_values():
    t = torch.zeros(3, 4)
    t[1, 2] = float("nan")
    t[2, 0] = float("inf")
    t[2, 3] = float("-inf")
    t[2, 1] = float("nan")
    ts = scan_tensor("w", t)
    assert (ts.nan, ts.posinf, ts.neginf) == (2, 1, 1)
    assert ts.first_index == [1, 2] and not ts.finite
    assert ts.absmax == 0.0  # over finite values only
    assert ts.nonfinite_dict()["first_index"] == [1, 2]


def test_absmax_gives_headroom_and_overflow_per_target_dtype():
    ts = scan_tensor("w", torch.tensor([1.0, -70000.0, 3.0]))
    assert ts.finite and ts.first_index is None and ts.absmax == 70000.0
    assert ts.overflows["fp16"] is True and ts.overflows["bf16"] is False
    assert ts.headroom["fp16"] == pytest.approx(65504 / 70000)
    assert ts.overflows["fp8-e4m3"] is True  # max 448


def test_fp16_underflow_fractions_are_exact_on_a_small_tensor():
    # 1e-8 flushes to 0 in fp16 (below half the smallest subnormal 2**-24), 1e-6 is subnormal, 1.0 normal
    ts = scan_tensor("w", torch.tensor([1e-8, 1e-6, 1.0, 0.0]))
    assert not ts.sampled
    assert ts.fp16_zero_frac == pytest.approx(1 / 4) and ts.fp16_subnormal_frac == pytest.approx(1 / 4)
    assert ts.min_nonzero == pytest.approx(1e-8)


def test_already_fp16_has_no_underflow_pass():
    ts = scan_tensor("w", torch.tensor([1e-6, 1.0], dtype=torch.float16))
    assert ts.fp16_zero_frac == 0.0 and ts.fp16_subnormal_frac is None


def test_large_tensors_are_sampled_unless_exact():
    n = SAMPLE * 4
    t = torch.ones(n)
    t[1::2] = 1e-8  # half flushes to zero in fp16, spread evenly so the strided sample sees it
    sampled = scan_tensor("w", t)
    exact = scan_tensor("w", t, exact=True)
    assert sampled.sampled and not exact.sampled
    assert exact.fp16_zero_frac == pytest.approx(0.5)
    assert sampled.fp16_zero_frac == pytest.approx(0.0)  # stride 4 lands on the even (1.0) elements only


def test_pieces_add_up_to_the_whole_tensor_scan():
    t = torch.randn(1000)
    t[700] = float("nan")
    whole = scan_tensor("w", t)
    acc = TensorStatsAccumulator(t.numel(), "F32", exact=False)
    acc.add(0, t[:500].numpy())
    acc.add(500, t[500:].numpy())
    parts = acc.finish(TensorScan("w", "float32", [1000], 1000), [1000])
    assert (whole.nan, whole.first_index) == (1, [700])
    assert (parts.nan, parts.first_index, parts.absmax) == (whole.nan, whole.first_index, whole.absmax)
    assert parts.fp16_zero_frac == whole.fp16_zero_frac


def test_zero_runs_count_as_finite_zeros():
    acc = TensorStatsAccumulator(10, "F32", exact=False)
    acc.add(0, np.full(5, 2.0, dtype=np.float32))
    acc.add_zeros(5, 5)
    ts = acc.finish(TensorScan("w", "float32", [10], 10), [10])
    assert ts.finite and ts.absmax == 2.0 and ts.fp16_zero_frac == 0.0


def test_skipped_tensors_say_why():
    assert scan_tensor("ids", torch.arange(3)).skipped == "not floating point"
    assert scan_tensor("e", torch.empty(0)).skipped == "empty"


def test_scan_weights_over_a_real_file_and_near_overflow(tmp_path):
    bad = torch.ones(2, 2)
    bad[0, 1] = float("nan")
    f = tmp_path / "m.safetensors"
    save_file(
        {"bad": bad, "big": torch.full((3,), 60000.0), "ok": torch.ones(3), "ids": torch.arange(2)}, str(f)
    )
    seen: list[str] = []
    ws = scan_weights(open_checkpoint(f), progress=lambda name, nbytes: seen.append(name))
    assert sorted(seen) == ["bad", "big", "ids", "ok"] and ws.n_tensors == 4 and ws.n_skipped == 1
    assert [t.name for t in ws.nonfinite] == ["bad"] and ws.nonfinite[0].first_index == [0, 1]
    assert [t.name for t in ws.near_overflow("fp16", 2.0)] == ["big"]
    assert ws.bytes == 4 * 4 + 3 * 4 + 3 * 4 + 2 * 8
    assert next(t for t in ws.tensors if t.name == "ok").headroom["fp16"] == 65504.0
    assert math.isinf(scan_tensor("z", torch.zeros(2)).headroom["fp16"])
