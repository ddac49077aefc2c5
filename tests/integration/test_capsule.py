"""Capsules: a failing training step written by ``watch(capsule_dir=...)`` in one process and
replayed by ``nanhunter scan DIR/step-<k>`` in another (the test's own, ``cli_main``), which rebuilds the model (from the HF
config, or from ``--arch``) and reports the same first non-finite value.

Three real training loops, in one subprocess (``WRITER``):

- ``gate``: an ``--arch`` model whose ``Gate`` computes ``x * sqrt(mean(x²))``; a layer whose
  weights are zeroed after step 1 feeds it zeros, so step 2's backward divides by sqrt(0) = 0
  (``SqrtBackward0``, ``aten.div.Tensor``, NaN); written with ``arch=`` given to ``watch()``.
- ``llama``: a fp16 ``LlamaForCausalLM`` built from a tiny config, whose final norm sees hidden
  states of rms ~1e-5 (tiny embeddings, zeroed o_proj/down_proj), so its backward divides the
  incoming gradient by that rms: ~2e5, beyond fp16's 65504 where it is cast back to fp16
  (``ToCopyBackward0``); the forward is finite. The capsule holds the HF config.
- ``forward``: a fp16 ``LlamaForCausalLM`` (tied embeddings) whose layer-1 MLP overflows fp16 at
  its down projection in the forward, in a no-grad loop (inference): a forward capsule.
- ``amp``: fp32 parameters under ``torch.autocast("cpu", float16)``; a ``Scale`` module computes
  ``(x * 1e-3) * 1e3``, whose backward multiplies the incoming gradient by 1e3 first: at step 2
  (gradient 100) that is 1e5, beyond fp16 (``MulBackward0``). The capsule records the autocast.
- ``adam``: an fp16 MLP under Adam, eps 1e-8 rounding to 0 in fp16: where a gradient column is
  exactly 0 the first step divides 0 by 0 (``aten.addcdiv_``); written without ``arch=``, so
  only ``--arch`` can rebuild it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = (
    pytest.mark.slow
)  # one subprocess of the training loops, then one CLI run (in-process) per capsule

MODELS = Path(__file__).resolve().parents[1] / "models"  # training_nets.py: the models written and rebuilt
SHIPPED = MODELS.parents[1] / "examples" / "capsules" / "adam-eps-fp16" / "step-0"  # any valid capsule

WRITER = """
import json, sys
import torch, transformers
import nan_hunter
sys.path.insert(0, sys.argv[1])
from training_nets import build_gate, build_mlp, build_scale

out, arch = sys.argv[2], sys.argv[1] + "/training_nets.py:build_gate"
seen = {}


def fnf(w):
    r = w.report()
    return {"first_nonfinite": r["first_nonfinite"], "cause": r.diagnosis.cause if r.diagnosis else None,
            "notes": r.notes}


torch.manual_seed(0)
m = build_gate()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
with nan_hunter.watch(m, level="modules", backward=True, optimizer=opt, capsule_dir=out + "/gate", arch=arch) as w:
    for step in range(4):
        loss = m(torch.randn(3, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 1:
            with torch.no_grad():
                m.layers[1].lin.weight.zero_()
                m.layers[1].lin.bias.zero_()
    seen["gate"] = fnf(w)

cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                               tie_word_embeddings=False, rms_norm_eps=1e-12)
torch.manual_seed(0)
m = transformers.LlamaForCausalLM(cfg)
with torch.no_grad():
    m.model.embed_tokens.weight.mul_(3e-4)
    m.lm_head.weight.mul_(100)
    for layer in m.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
m = m.half()
opt = torch.optim.SGD(m.parameters(), lr=0.0)
ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
with nan_hunter.watch(m, backward=True, optimizer=opt, capsule_dir=out + "/llama") as w:
    for step in range(2):
        loss = m(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    seen["llama"] = fnf(w)

cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                               num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
torch.manual_seed(0)
m = transformers.LlamaForCausalLM(cfg)
mlp = m.model.layers[1].mlp
with torch.no_grad():
    mlp.gate_proj.weight.fill_(1.0)
    mlp.up_proj.weight.fill_(1.0)
    mlp.down_proj.weight.fill_(3e4)
m = m.half()
with nan_hunter.watch(m, capsule_dir=out + "/forward") as w:
    with torch.no_grad():
        for step in range(3):
            m(input_ids=ids[:, : 4 + step])
    seen["forward"] = fnf(w)

torch.manual_seed(0)
m = build_mlp().half()
opt = torch.optim.Adam(m.parameters(), lr=1e-3)
with nan_hunter.watch(m, level="modules", backward=True, optimizer=opt, capsule_dir=out + "/adam") as w:
    for step in range(3):
        x = torch.randn(4, 8).half()
        x[:, 3] = 0
        loss = m(x).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    seen["adam"] = fnf(w)
torch.manual_seed(0)
m = build_scale()
opt = torch.optim.SGD(m.parameters(), lr=0.0)
with nan_hunter.watch(m, backward=True, optimizer=opt, capsule_dir=out + "/amp",
                      arch=sys.argv[1] + "/training_nets.py:build_scale") as w:
    for step in range(3):
        with torch.autocast("cpu", dtype=torch.float16):
            y = m(torch.ones(2, 4))
        loss = y.float().sum() * 50 * 2 ** step  # gradients of 25, 50, 100 reach Scale: x1e3 > 65504 at step 2
        opt.zero_grad()
        loss.backward()
        opt.step()
    seen["amp"] = fnf(w)
print(json.dumps(seen))
"""

SAME = ("module", "op", "kind", "phase", "grad_fn", "param")


@pytest.fixture(scope="module")
def capsules(tmp_path_factory) -> dict:
    """Capsules written by real training loops in a process of their own, and what each watch reported."""
    pytest.importorskip("transformers")
    src = MODELS
    out = tmp_path_factory.mktemp("capsules")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run(
        [sys.executable, "-c", WRITER, str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    dirs = {}
    for name in ("gate", "llama", "forward", "adam", "amp"):
        steps = sorted((out / name).glob("step-*"))
        assert len(steps) == 1, (name, seen[name]["notes"])
        dirs[name] = steps[0]
    return {"src": src, "dirs": dirs, "seen": seen}


def tree_hash(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        h.update(str(p.relative_to(d)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def replayed(cli, capsule: Path, *extra: object) -> dict:
    before = tree_hash(capsule)
    res = cli("scan", capsule, *extra, "-q")  # cli_main: this process, not the one that wrote it
    assert res.code == 1, res.stderr
    assert tree_hash(capsule) == before, "the scan changed the capsule directory"
    return res.report


def test_arch_backward_capsule_replays_the_same_fault(capsules, cli_main, tmp_path):
    """sqrt at 0 in a backward: step 2, rebuilt from the arch the watch was given."""
    seen = capsules["seen"]["gate"]
    want = seen["first_nonfinite"]
    assert (want["module"], want["phase"], want["grad_fn"], want["step"]) == (
        "layers.1.gate",
        "backward",
        "SqrtBackward0",
        2,
    )
    cap = capsules["dirs"]["gate"]
    assert cap.name == "step-2"
    html = tmp_path / "gate.html"
    rep = replayed(cli_main, cap, "--report", html)
    got = rep["first_nonfinite"]
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
    page = html.read_text()
    assert "SqrtBackward0" in page and "backward · step 2" in page and "autograd node" in page
    assert got["step"] == 2 and got["source"].endswith(
        "return x * torch.sqrt((x * x).mean(-1, keepdim=True))"
    )
    assert rep["diagnosis"]["cause"] == seen["cause"] == "division_by_zero"
    assert rep["checkpoint"]["format"] == "capsule" and rep["checkpoint"]["capsule"]["phase"] == "backward"
    assert rep["run"]["failed_inputs"] == [0] and rep["weights"]["nonfinite"] == []
    # backward replay of the Gate from its captured input and incoming gradient: 0/0 in every dtype
    assert set(rep["replay"]) >= {"fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2"}
    assert all(
        not rep["replay"][d]["finite"] and rep["replay"][d]["nan"] > 0 for d in ("fp32", "bf16", "fp16")
    )


def test_llama_config_capsule_replays_the_same_fault(capsules, cli_main):
    """A transformers model rebuilt from the config in capsule.json: the fp16 backward overflow."""
    seen = capsules["seen"]["llama"]
    want = seen["first_nonfinite"]
    assert (want["module"], want["phase"], want["grad_fn"]) == ("model.norm", "backward", "ToCopyBackward0")
    cap = capsules["dirs"]["llama"]
    meta = json.loads((cap / "capsule.json").read_text())
    assert meta["model_class"] == "LlamaForCausalLM" and "arch" not in meta
    rep = replayed(cli_main, cap)
    got = rep["first_nonfinite"]
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
    assert got["step"] == want["step"] == 0
    assert rep["diagnosis"]["cause"] == seen["cause"] == "overflow"
    assert rep["run"]["dtype"] == "fp16"
    # the norm's backward in fp16 overflows, in fp32/bf16 it holds ~2e5
    assert not rep["replay"]["fp16"]["finite"] and rep["replay"]["fp16"]["posinf"] > 0
    assert rep["replay"]["fp32"]["finite"] and rep["replay"]["bf16"]["finite"]
    assert rep["replay"]["fp32"]["absmax"] > 65504


def test_forward_capsule_of_a_tied_llama(capsules, cli_main):
    """A forward fault at the first step: the same module and op, from the config; tied weights load."""
    seen = capsules["seen"]["forward"]
    want = seen["first_nonfinite"]
    assert (want["module"], want["phase"], want["op"]) == (
        "model.layers.1.mlp.down_proj",
        "forward",
        "aten.mm.default",
    )
    rep = replayed(cli_main, capsules["dirs"]["forward"])
    got = rep["first_nonfinite"]
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME} and got["step"] == want["step"] == 0
    assert rep["diagnosis"]["cause"] == seen["cause"] == "overflow"
    assert not rep["replay"]["fp16"]["finite"] and rep["replay"]["fp32"]["finite"]


def test_optimizer_capsule_replays_with_arch(capsules, cli_main):
    """Adam's eps rounding to 0 in fp16: the capsule has no arch, so --arch rebuilds the model."""
    seen = capsules["seen"]["adam"]
    want = seen["first_nonfinite"]
    assert (want["phase"], want["param"], want["op"]) == ("optimizer", "0.weight", "aten.addcdiv_.default")
    cap = capsules["dirs"]["adam"]
    meta = json.loads(
        (cap / "capsule.json").read_text()
    )  # neither a config nor an arch: refused without --arch
    assert not isinstance(meta.get("config"), dict) and not isinstance(meta.get("arch"), str), meta.keys()
    rep = replayed(cli_main, cap, "--arch", f"{capsules['src'] / 'training_nets.py'}:build_mlp")
    got = rep["first_nonfinite"]
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
    assert got["step"] == want["step"] == 0
    assert rep["diagnosis"]["cause"] == seen["cause"] == "division_by_zero"
    assert any("eps 1e-08 rounds to 0 in fp16" in e for e in rep["diagnosis"]["evidence"])
    # the same parameter step per dtype: eps 1e-8 survives in fp32 and bf16, not in fp16
    assert rep["replay"]["fp32"]["finite"] and rep["replay"]["bf16"]["finite"]
    assert not rep["replay"]["fp16"]["finite"] and rep["replay"]["fp16"]["nan"] > 0


def test_autocast_capsule_replays_under_its_autocast(capsules, cli_main):
    """fp32 parameters, fp16 autocast: the replay runs under the recorded autocast and measures
    the overflow against fp16's max."""
    seen = capsules["seen"]["amp"]
    want = seen["first_nonfinite"]
    assert (want["module"], want["phase"], want["grad_fn"], want["step"]) == (
        "1",
        "backward",
        "MulBackward0",
        2,
    )
    cap = capsules["dirs"]["amp"]
    assert json.loads((cap / "capsule.json").read_text())["autocast"] == [["cpu", "float16"]]
    rep = replayed(cli_main, cap)
    got = rep["first_nonfinite"]
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME} and got["step"] == 2
    d = rep["diagnosis"]
    assert (
        d["cause"] == seen["cause"] == "overflow"
        and d["dtype"] == "fp16"
        and "65504" in " ".join(d["evidence"])
    )
    assert rep["run"]["autocast"] == {"device_type": "cpu", "dtype": "fp16"}
    assert rep["replay"]["fp32"]["finite"] and not rep["replay"]["fp16"]["finite"]


def test_capsule_without_config_or_arch_exits_2(cli_main, tmp_path):
    """As watch() writes one for a model that is not a transformers one, without arch= (the adam
    capsule above): a copy of the shipped capsule without its config."""
    cap = tmp_path / "step-0"
    shutil.copytree(SHIPPED, cap)
    meta = json.loads((cap / "capsule.json").read_text())
    del meta["config"], meta["model_class"]
    (cap / "capsule.json").write_text(json.dumps(meta))
    res = cli_main("scan", cap, json_report=False)
    assert res.code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "neither" in res.stderr and "arch" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "change, words",
    [
        ({"schema": "nanhunter.capsule/v0"}, "not a nanhunter capsule"),
        ({"phase": "sideways"}, "phase"),
        ({"step": -1}, "step"),
        ({"files": ["../model.safetensors"]}, "not a plain name"),
        ({"model_class": "AutoConfig"}, "not a model class"),
        ({"config": {"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "x.M"}}}, "auto_map"),
    ],
)
def test_bad_capsule_json_exits_2(cli_main, tmp_path, change, words):
    """What is refused is the command's decision (tests/unit/load/test_capsule.py has the format's
    own errors), on a copy of the shipped capsule (a LlamaForCausalLM with its HF config)."""
    cap = tmp_path / "step-0"
    shutil.copytree(SHIPPED, cap)
    meta = json.loads((cap / "capsule.json").read_text())
    meta.update(change)
    (cap / "capsule.json").write_text(json.dumps(meta))
    res = cli_main("scan", cap, json_report=False)
    assert res.code == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and words in res.stderr, res.stderr


def test_options_a_capsule_fixes_exit_2(cli_main):
    """The capsule brings its own inputs and dtype: --dtype (or --prompt, --backward...) is refused."""
    res = cli_main("scan", SHIPPED, "--dtype", "bf16", json_report=False)
    assert res.code == 2 and "--dtype does not apply to a capsule" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
