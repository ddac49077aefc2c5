"""The Python API's repeatable options (``prompts``, ``inputs``, ``checkpoints``...): a string is one
item, as one flag is on the command line (contract v1.3, "a string is one prompt"). Before,
``nan_hunter.scan(dir, prompts="hello")`` ran five one-character prompts, silently."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

import nan_hunter
from nan_hunter.pipeline.ci_check import check

TINY_LLAMA = "examples/tiny-llama-fp16"


def _texts(rep) -> list[str]:
    return [i["text"] for i in rep.inputs]


def test_scan_prompts_string_is_one_prompt():
    rep = nan_hunter.scan(TINY_LLAMA, prompts="hello", device="cpu")
    assert rep.run["n_inputs"] == 1 and _texts(rep) == ["hello"]
    # a list is as before
    rep = nan_hunter.scan(TINY_LLAMA, prompts=["hello", "world"], device="cpu")
    assert _texts(rep) == ["hello", "world"]


def test_bisect_prompts_string_is_one_prompt():
    rep = nan_hunter.bisect(TINY_LLAMA, prompts="hello", dtype="fp16", device="cpu")
    assert rep.run["n_inputs"] == 1 and rep.run["inputs"] == ["prompt 0"]


def test_check_prompts_and_checkpoints_strings_are_one_item():
    [rep] = check(TINY_LLAMA, prompts="hello", dtypes="fp16", device="cpu")
    assert rep.check["runs"]["fp16"]["n_inputs"] == 1 and _texts(rep) == ["hello"]


def test_inputs_string_and_path_are_one_file(tmp_path, overflow_model):
    ins = tmp_path / "in.safetensors"
    save_file({"input": torch.ones(2, 4)}, str(ins))
    for given in (str(ins), ins):
        rep = nan_hunter.scan(overflow_model["ck"], arch=overflow_model["arch"], inputs=given, device="cpu")
        assert rep.run["n_inputs"] == 1 and rep.run["inputs"] == ["in.safetensors"]
