"""nn.MultiheadAttention's fused fast path over a fully masked row (``need_weights=True``, eval,
no grad): the slow path is re-run to name the op (the softmax), diagnosed ``masked_softmax``,
and the safe-softmax fix verified on a copy."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from nan_hunter.pipeline.scan_checkpoint import scan

MODEL = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x, mask):
        out, _ = self.attn(x, x, x, key_padding_mask=mask, need_weights=True)
        return out


def build():
    return Net()
"""


def test_fully_masked_row_through_the_fast_path(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    torch.manual_seed(0)
    attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    save_file(
        {f"attn.{k}": v.contiguous() for k, v in attn.state_dict().items()},
        str(tmp_path / "model.safetensors"),
    )
    mask = torch.zeros(2, 3, dtype=torch.bool)
    mask[1] = True  # every key of the second sequence masked
    save_file({"x": torch.randn(2, 3, 8), "mask": mask}, str(tmp_path / "inputs.safetensors"))
    fast = torch.backends.mha.get_fastpath_enabled()
    rep = scan(
        str(tmp_path / "model.safetensors"),
        arch=f"{tmp_path / 'model.py'}:build",
        inputs=[str(tmp_path / "inputs.safetensors")],
        dtype="fp32",
        device="cpu",
    )
    assert torch.backends.mha.get_fastpath_enabled() == fast  # the user's setting is restored
    f, d = rep.first_nonfinite, rep.diagnosis
    assert f.module == "attn" and f.op == "aten._softmax.default" and f.kind == "nan"
    assert d.cause == "masked_softmax" and "safe softmax" in d.fix.lower()
    assert any("fast path" in n and "_native_multi_head_attention" in n for n in rep.notes)
    assert d.fix_verified is not None and d.fix_verified.finite and "safe softmax" in d.fix_verified.change
