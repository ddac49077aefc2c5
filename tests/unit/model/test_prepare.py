"""nan_hunter/model/prepare.py: everything a run needs, built once from real files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.config import default_config
from nan_hunter.dtypes import parse_dtype
from nan_hunter.errors import BadInput
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.model.prepare import checkpoint_dtype, prepare

ARCH = """
from torch import nn

def build():
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
"""


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    (tmp_path / "m.py").write_text(ARCH)
    torch.manual_seed(0)
    sd = {
        "0.weight": torch.randn(4, 4, dtype=torch.float16),
        "0.bias": torch.zeros(4, dtype=torch.float16),
        "1.weight": torch.randn(2, 4, dtype=torch.float16),
        "1.bias": torch.zeros(2, dtype=torch.float16),
    }
    save_file(sd, str(tmp_path / "m.safetensors"))
    save_file({"input": torch.ones(3, 4)}, str(tmp_path / "in.safetensors"))
    return {
        "ck": tmp_path / "m.safetensors",
        "arch": tmp_path / "m.py",
        "inputs": tmp_path / "in.safetensors",
    }


def test_parse_dtype():
    assert parse_dtype(None) is None
    assert parse_dtype("float16") == "fp16" and parse_dtype("bfloat16") == "bf16"
    with pytest.raises(BadInput, match="--dtype"):
        parse_dtype("int7")


def test_checkpoint_dtype_is_the_most_common_float_dtype(files, tmp_path):
    assert checkpoint_dtype(open_checkpoint(files["ck"])) == "fp16"
    save_file(
        {"a": torch.ones(10), "b": torch.ones(2, dtype=torch.bfloat16), "i": torch.arange(99)},
        str(tmp_path / "mixed.safetensors"),
    )
    assert checkpoint_dtype(open_checkpoint(tmp_path / "mixed.safetensors")) == "fp32"


def test_prepare_builds_casts_and_batches(files):
    p = prepare(
        open_checkpoint(files["ck"]),
        f"{files['arch']}:build",
        [str(files["inputs"])],
        None,
        None,
        None,
        "cpu",
        default_config(),
    )
    assert p.how == "arch" and p.dtype == "fp16"  # the checkpoint's own dtype by default
    assert p.model[0].weight.dtype == torch.float16 and not p.model.training
    assert p.labels == ["in.safetensors"] and p.batches[0]["input"].dtype == torch.float16
    assert torch.equal(p.model[1].weight.detach(), open_checkpoint(files["ck"]).tensor("1.weight"))
    p32 = prepare(
        open_checkpoint(files["ck"]),
        f"{files['arch']}:build",
        [str(files["inputs"])],
        None,
        None,
        "fp32",
        "cpu",
        default_config(),
    )
    assert p32.dtype == "fp32" and p32.batches[0]["input"].dtype == torch.float32


def test_no_model_and_no_inputs(files):
    ck = open_checkpoint(files["ck"])
    assert prepare(ck, None, None, None, None, None, "cpu", default_config()) is None
    with pytest.raises(BadInput, match="no model can be built"):
        prepare(ck, None, [str(files["inputs"])], None, None, None, "cpu", default_config())
    with pytest.raises(BadInput, match="needs a model"):
        prepare(ck, None, None, None, None, None, "cpu", default_config(), need_model=True)
    p = prepare(ck, f"{files['arch']}:build", None, None, None, None, "cpu", default_config())
    assert p.batches == [] and "weights-only scan" in p.notes[0]
    with pytest.raises(BadInput, match="no inputs"):
        prepare(
            ck, f"{files['arch']}:build", None, None, None, None, "cpu", default_config(), need_model=True
        )
