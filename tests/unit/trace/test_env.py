"""The environment block: flush-to-zero probed (torch has no getter), inputs hashed by value."""

from __future__ import annotations

import torch

from nan_hunter.trace.env import environment, flush_denormal, inputs_hash


def test_flush_denormal_is_probed():
    before = flush_denormal()
    try:
        if not torch.set_flush_denormal(True):  # pragma: no cover - a CPU without FTZ/DAZ
            return
        assert flush_denormal() is True
        assert environment(torch.device("cpu"), "fp32")["flush_denormal"] is True
    finally:
        torch.set_flush_denormal(before)
    assert flush_denormal() is before


def test_environment_keys():
    env = environment(torch.device("cpu"), "bf16", "inductor")
    for k in (
        "versions",
        "device",
        "device_name",
        "dtype",
        "autocast",
        "threads",
        "deterministic",
        "flush_denormal",
        "tf32",
        "matmul_precision",
        "compile",
    ):
        assert k in env
    assert (
        env["threads"] == torch.get_num_threads() and env["compile"] == "inductor" and env["dtype"] == "bf16"
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert environment(torch.device("cpu"), None)["autocast"] == {"device_type": "cpu", "dtype": "bf16"}


def test_inputs_hash_is_by_value_names_and_order():
    ids = torch.tensor([[1, 2, 3]])
    assert inputs_hash((), {"input_ids": ids}) == inputs_hash((), {"input_ids": ids.clone()})
    assert inputs_hash((), {"input_ids": ids}) != inputs_hash((), {"input_ids": ids + 1})
    assert inputs_hash((), {"input_ids": ids}) != inputs_hash((), {"ids": ids})
