"""Right answers on real code: numbers from the op that overflowed, in-place ops judged on their
operands before the op, absorbed values that are harmless not called wrong, weights blamed on
their owner, the model's own source line, and nn.MultiheadAttention's fused fast path."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

import nan_hunter
from nan_hunter.capture import ops

QK = Path(__file__).resolve().parents[2] / "examples" / "incidents" / "qk_overflow"


def test_qk_overflow_evidence_is_the_bmm_result_not_the_module_output(cli_main):
    """The bmm's result is 3 · 200 · 128 = 76800; the module's output after softmax and the
    projection is 0.751 (before, the evidence line said "absmax 0.751 > fp16 max 65504")."""
    res = cli_main(
        "scan",
        QK / "model.safetensors",
        "--arch",
        f"{QK / 'model.py'}:build",
        "--inputs",
        QK / "inputs.safetensors",
        "--dtype",
        "fp16",
    )
    assert res.code == 1, res.stderr
    assert "absmax 0.751" not in res.stdout
    d = res.report["diagnosis"]
    assert d["cause"] == "overflow" and d["op"] == "aten.bmm.default"
    assert d["evidence"][0].startswith("absmax 7.68e+04 > fp16 max 65504 at aten.bmm.default")


def _save(tmp_path: Path, model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[str, str]:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "model.safetensors")
    save_file(inputs, tmp_path / "inputs.safetensors")
    return str(tmp_path / "model.safetensors"), str(tmp_path / "inputs.safetensors")


RESNET = """
import torch
from transformers import ResNetConfig, ResNetModel


def build():
    cfg = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 8], depths=[1, 1], layer_type="basic")
    model = ResNetModel(cfg).eval()
    with torch.no_grad():
        emb = model.embedder.embedder
        emb.convolution.weight.zero_()
        emb.normalization.bias.fill_(30000.0)  # the residual entering stage 0: 30000 everywhere
        layer = model.encoder.stages[0].layers[0]
        for conv in layer.layer:
            conv.convolution.weight.zero_()
        layer.layer[-1].normalization.bias.fill_(40000.0)  # the branch: 40000; 40000 + 30000 > 65504
    return model
"""


def test_resnet_inplace_residual_add_is_an_overflow(tmp_path):
    """transformers' ResNetBasicLayer does ``hidden_state += residual``: judged on its operands as
    they were before the add (40000 and 30000, finite) it is an overflow, not "unknown"."""
    pytest.importorskip("transformers")
    (tmp_path / "resnet.py").write_text(RESNET)
    import importlib.util

    spec = importlib.util.spec_from_file_location("resnet_arch", tmp_path / "resnet.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ck, inp = _save(tmp_path, mod.build(), {"pixel_values": torch.rand(1, 3, 32, 32)})
    r = nan_hunter.scan(ck, arch=f"{tmp_path / 'resnet.py'}:build", inputs=[inp], dtype="fp16")
    f = r.first_nonfinite
    assert (f.module, f.op, f.kind) == ("encoder.stages.0.layers.0", "aten.add_.Tensor", "posinf")
    assert "modeling_resnet.py" in f.source and "hidden_state += residual" in f.source
    assert r.diagnosis.cause == "overflow"
    assert r.diagnosis.evidence[0].startswith("absmax 7e+04 > fp16 max 65504 at aten.add_.Tensor")


GELU_NEW = """
import torch
from torch import nn
from transformers.activations import NewGELUActivation


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = NewGELUActivation()
        self.proj = nn.Linear(4, 2)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


def build():
    m = MLP()
    with torch.no_grad():
        m.fc.weight.fill_(12.5)  # ones in -> 50: pow(50, 3) = 125000 > fp16 max -> inf -> tanh -> 1
        m.fc.bias.zero_()
        m.proj.weight.fill_(0.01)
    return m
"""


def test_gelu_new_absorbed_inf_is_harmless_not_silently_wrong(tmp_path):
    """gelu_new's ``pow(x, 3)`` overflows fp16 for x = 50, ``tanh(inf)`` = 1 and the output is
    exactly x: the absorbed value is reported as harmless, with the float64 comparison."""
    pytest.importorskip("transformers")
    (tmp_path / "gelu.py").write_text(GELU_NEW)
    import importlib.util

    spec = importlib.util.spec_from_file_location("gelu_arch", tmp_path / "gelu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ck, inp = _save(tmp_path, mod.build(), {"x": torch.ones(1, 4)})
    r = nan_hunter.scan(ck, arch=f"{tmp_path / 'gelu.py'}:build", inputs=[inp], dtype="fp16")
    assert r.first_nonfinite is None
    absorbed = [m for m in r.near_misses if m["kind"] == "absorbed"]
    assert [(m["module"], m["op"]) for m in absorbed] == [("act", "aten.pow.Tensor_Scalar")]
    assert "silently wrong" not in absorbed[0]["message"]
    assert "harmless: act's output matches float64" in absorbed[0]["message"]


def test_rmsnorm_absorbed_inf_is_still_silently_wrong():
    """The other side of the same judgement: RMSNorm's variance overflows, rsqrt(inf) = 0, the
    output is all zeros — finite, and wrong."""

    class RMSNorm(nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    m = nn.Sequential(OrderedDict(norm=RMSNorm()))
    with torch.no_grad(), nan_hunter.watch(m, level="ops") as w:
        m(torch.full((1, 8), 300.0, dtype=torch.float16))
    ev = w.op_records[0]
    assert ev.module == "norm" and ev.op == "aten.pow.Tensor_Scalar"
    assert ev.outcome.startswith("the result is finite but silently wrong") and ev.rel_err > 0.5


def test_default_level_nan_weights_without_blocks_name_the_owner():
    """No repeated blocks, so the default level hooks only the root. A weight goes NaN in place
    between forwards and changes again after: no re-run is possible, and the capture alone must
    say role weights and the Linear that owns them (before: the root, as "producer")."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(up=nn.Linear(4, 4), act=nn.ReLU(), down=nn.Linear(4, 2)))
    x = torch.randn(3, 4)
    with torch.no_grad(), nan_hunter.watch(model) as w:
        model(x)
        model.up.weight[0, 0] = float("nan")  # a bad optimizer step
        model(x)
        model.down.weight.mul_(1.0)  # and one more: the weights forward 1 used are gone
        model(x)
    r = w.report()
    f = r.first_nonfinite
    assert (f.input_index, f.module, f.module_type, f.role, f.tensor) == (
        1,
        "up",
        "Linear",
        "weights",
        "weight",
    )
    assert any("parameters changed in place after forward 1" in n for n in r.notes)


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(4, 4)
        self.down = nn.Linear(4, 2)
        with torch.no_grad():
            self.up.weight.fill_(1e38)

    def forward(self, x):
        return self.down(self.up(x))  # the line the report names


def test_source_line_is_the_models_own_code_not_torch_linear():
    with torch.no_grad(), nan_hunter.watch(TwoLinears(), level="modules") as w:
        w.model(torch.ones(1, 4))
    f = w.report().first_nonfinite
    assert f.module == "up" and f.op in ("aten.addmm.default", "aten.mm.default")
    assert f.source.startswith(f"{__file__}:") and "self.down(self.up(x))" in f.source


def test_only_torch_itself_counts_as_inside_torch():
    """torchao/ and torchvision/ sit beside torch/ in site-packages: they are model code."""
    site = os.path.dirname(ops._TORCH_DIR.rstrip(os.sep))
    assert not ops.is_model_code(os.path.join(site, "torch", "nn", "modules", "linear.py"))
    assert ops.is_model_code(os.path.join(site, "torchao", "quantization", "linear.py"))
    assert ops.is_model_code(os.path.join(site, "torchvision", "models", "resnet.py"))


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        with torch.no_grad():
            self.attn.in_proj_weight.fill_(1e20)  # q · k = 64e40: past the fp32 max

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def test_multihead_attention_fused_fast_path_is_re_run_on_its_slow_path_to_name_the_op():
    """Eval and no grad: the forward ran torch._native_multi_head_attention, and the re-run (with
    query is key is value kept) runs it too (before: the copies broke the aliasing, the re-run
    took the slow path without saying so). The fused op names no cause, so the module is re-run on
    its slow path, as a scan does, and the report says which op that names and that the fast path ran."""
    m = SelfAttention().eval()
    with torch.no_grad(), nan_hunter.watch(m, level="modules") as w:
        m(torch.randn(1, 3, 8))
    r = w.report()
    assert r.first_nonfinite.module == "attn"
    assert "_native_multi_head_attention" not in r.first_nonfinite.op
    assert any(
        "ran its fused fast path (aten._native_multi_head_attention.default)" in n
        and r.first_nonfinite.op in n
        for n in r.notes
    )
    assert not any("took its slow path on the re-run" in n for n in r.notes)  # it ran the fused path
    assert torch.backends.mha.get_fastpath_enabled()  # the setting is restored


def test_multihead_attention_slow_path_is_said():
    """With grad on, nn.MultiheadAttention takes its slow path, in the forward and in the re-run
    made under the same grad mode: the report says so."""
    m = SelfAttention().eval()
    with nan_hunter.watch(m, level="modules") as w:
        m(torch.randn(1, 3, 8))
    r = w.report()
    assert r.first_nonfinite.module == "attn" and "_native_multi_head_attention" not in r.first_nonfinite.op
    assert any("took its slow path" in n for n in r.notes)
