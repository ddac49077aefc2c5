"""``nanhunter scan --backward`` and ``bisect --backward``: faults that exist only in the backward.

- A tiny fp16 ``LlamaForCausalLM`` (transformers, from a config) whose final norm sees hidden
  states of rms ~1e-5 (tiny embeddings, zeroed o_proj/down_proj): its forward is finite, its
  backward divides the incoming gradient by that rms, ~2e5, which overflows fp16 where the
  norm casts the gradient back to fp16 (``ToCopyBackward0``). The model's own loss is used
  (labels = input_ids).
- An ``--arch`` model whose ``Scale`` computes ``(x * 1e-3) * 1e3``: the identity forward, but
  its backward multiplies the incoming gradient (~100 under ``--loss``: 200·sum) by 1e3 first:
  inf in fp16. Keeping ``scale`` in fp32 fixes it, which ``bisect --backward`` finds; a plain
  bisect sees a finite forward and keeps nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a dozen CLI runs of a few seconds each

SCALE_ARCH = """
from collections import OrderedDict
from torch import nn


class Scale(nn.Module):
    def forward(self, x):
        return (x * 1e-3) * 1e3


def build():
    return nn.Sequential(OrderedDict(up=nn.Linear(4, 4), scale=Scale(), down=nn.Linear(4, 1)))
"""

LOSS = """
def loss(outputs, batch):
    return outputs.float().sum() * 200


def leaves(outputs, batch):
    import sys
    sys.exit(3)
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> dict[str, str]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("llama-bwd")
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
        rms_norm_eps=1e-12,
    )
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(3e-4)  # hidden states of rms ~1e-5 reach the final norm
        m.lm_head.weight.mul_(100)  # gradients of ~1 reach it
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    m.save_pretrained(d, safe_serialization=True)
    save_file({"input_ids": torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])}, str(d / "inputs.safetensors"))
    return {"dir": str(d), "inputs": str(d / "inputs.safetensors")}


@pytest.fixture(scope="module")
def scale(tmp_path_factory) -> dict[str, str]:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("scale")
    (d / "model.py").write_text(SCALE_ARCH)
    (d / "loss.py").write_text(LOSS)
    ns: dict = {}
    exec(SCALE_ARCH, ns)
    torch.manual_seed(0)
    m = ns["build"]()
    with torch.no_grad():
        m.down.weight.fill_(0.5)
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(d / "model.safetensors"))
    save_file({"input": torch.ones(2, 4)}, str(d / "inputs.safetensors"))
    return {
        "dir": str(d),
        "ck": str(d / "model.safetensors"),
        "arch": f"{d / 'model.py'}:build",
        "inputs": str(d / "inputs.safetensors"),
        "loss": f"{d / 'loss.py'}:loss",
        "exits": f"{d / 'loss.py'}:leaves",
    }


def test_llama_backward_only_fault(llama, cli_main, tmp_path):
    fwd = cli_main("scan", llama["dir"], "--inputs", llama["inputs"], "--dtype", "fp16", "-q")
    assert fwd.code == 0, fwd.stderr  # the forward alone is finite
    md = tmp_path / "report.md"
    res = cli_main(
        "scan", llama["dir"], "--inputs", llama["inputs"], "--dtype", "fp16", "--backward", "--report", md
    )
    assert res.code == 1, res.stderr
    rep = res.report
    f = rep["first_nonfinite"]
    assert (f["phase"], f["module"], f["grad_fn"], f["op"]) == (
        "backward",
        "model.norm",
        "ToCopyBackward0",
        "aten._to_copy.default",
    )
    assert f["kind"] == "posinf" and f["step"] == 0 and f["role"] == "producer"
    assert "hidden_states.to(torch.float32)" in f["source"]
    assert rep["diagnosis"]["cause"] == "overflow" and "backward" in rep["diagnosis"]["summary"]
    assert rep["run"]["failed_inputs"] == [0] and rep["run"]["backward"] is True
    # the backward replay of the norm: ~2e5 gradients, beyond fp16 only
    r = rep["replay"]
    assert (
        not r["fp16"]["finite"]
        and r["fp32"]["finite"]
        and r["bf16"]["finite"]
        and r["fp32"]["absmax"] > 65504
    )
    # terminal and Markdown name the phase and the autograd node
    assert (
        "autograd node" in res.stdout and "ToCopyBackward0" in res.stdout and "in the backward" in res.stdout
    )
    text = md.read_text()
    assert "ToCopyBackward0" in text and "backward · step 0" in text


def test_loss_file_on_an_arch_model(scale, cli_main):
    res = cli_main(
        "scan",
        scale["ck"],
        "--arch",
        scale["arch"],
        "--inputs",
        scale["inputs"],
        "--dtype",
        "fp16",
        "--backward",
        "--loss",
        scale["loss"],
        "-q",
    )
    assert res.code == 1, res.stderr
    f = res.report["first_nonfinite"]
    assert (f["phase"], f["module"], f["grad_fn"], f["op"], f["kind"]) == (
        "backward",
        "scale",
        "MulBackward0",
        "aten.mul.Tensor",
        "posinf",
    )
    assert f["source"].endswith("return (x * 1e-3) * 1e3")
    assert res.report["diagnosis"]["cause"] == "overflow"
    assert res.report["replay"]["fp32"]["finite"] and not res.report["replay"]["fp16"]["finite"]
    assert not (Path(scale["dir"]) / "__pycache__").exists()


@pytest.mark.parametrize(
    "extra, words",
    [
        ((), "--loss file.py:fn"),  # not a causal LM: no loss of its own
        (("--loss", "LOSS_EXITS"), "sys.exit(3)"),
        (("--loss", "nowhere.py:fn"), "--loss 'nowhere.py:fn'"),
    ],
)
def test_backward_without_a_usable_loss_exits_2(scale, cli_main, extra, words):
    extra = tuple(scale["exits"] if e == "LOSS_EXITS" else e for e in extra)
    res = cli_main(
        "scan",
        scale["ck"],
        "--arch",
        scale["arch"],
        "--inputs",
        scale["inputs"],
        "--backward",
        *extra,
        json_report=False,
    )
    assert res.code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and words in res.stderr, res.stderr


def test_bisect_backward_keeps_the_module_whose_backward_overflows(scale, cli_main):
    args = (
        "bisect",
        scale["ck"],
        "--arch",
        scale["arch"],
        "--inputs",
        scale["inputs"],
        "--dtype",
        "fp16",
        "-q",
    )
    plain = cli_main(*args)
    assert plain.code == 0 and plain.report["bisect"]["already_finite"]  # the forward needs nothing
    res = cli_main(*args, "--backward", "--loss", scale["loss"])
    assert res.code == 0, res.stderr
    b = res.report["bisect"]
    assert b["keep_modules"] == ["scale"] and b["finite_after"] and not b["already_finite"]
