"""bisect on small --arch models and apply_policy on the real MiniLM checkpoint.

Two cases run the real CLI (``cli``: exit 0 with a policy file, exit 1 when even fp32 fails); the
others run the same command in-process (``cli_main``): what they check is the search's answer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

import nan_hunter
from nan_hunter.bisection.search import run_bound

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture
def stack6(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("stack6", MODELS / "stack6.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    save_file(mod.build().state_dict(), str(tmp_path / "stack6.safetensors"))
    save_file({"x": torch.ones(2, 8)}, str(tmp_path / "in.safetensors"))
    save_file(mod.build_bad_everywhere().state_dict(), str(tmp_path / "logneg.safetensors"))
    return tmp_path, mod


def test_non_contiguous_culprits_exactly(cli_main, stack6):
    d, _ = stack6
    pol = d / "policy.yaml"
    res = cli_main(
        "bisect",
        d / "stack6.safetensors",
        "--arch",
        f"{MODELS / 'stack6.py'}:build",
        "--inputs",
        d / "in.safetensors",
        "--dtype",
        "fp16",
        "--policy-out",
        pol,
    )
    assert res.code == 0, res.stderr
    b = res.report["bisect"]
    assert b["keep_modules"] == ["layers.1", "layers.4"]
    assert b["finite_after"] is True and b["max_rel_err"] < 0.05
    assert b["runs"] <= run_bound(b["candidates"], 2) + 3  # search bound + reference, candidates, verify
    policy = yaml.safe_load(pol.read_text())
    assert policy["modules"] == {"layers.1": "fp32", "layers.4": "fp32"}


def test_block_granularity(cli_main, stack6):
    d, _ = stack6
    res = cli_main(
        "bisect",
        d / "stack6.safetensors",
        "--arch",
        f"{MODELS / 'stack6.py'}:build",
        "--inputs",
        d / "in.safetensors",
        "--granularity",
        "block",
    )
    assert res.code == 0
    assert res.report["bisect"]["keep_modules"] == ["layers.1", "layers.4"]


def test_fine_model_gives_empty_set(cli_main, tmp_path):
    lin = torch.nn.Linear(4, 4)
    save_file(lin.state_dict(), str(tmp_path / "lin.safetensors"))
    (tmp_path / "arch.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 4)\n")
    save_file({"input": torch.randn(2, 4)}, str(tmp_path / "in.safetensors"))
    res = cli_main(
        "bisect",
        tmp_path / "lin.safetensors",
        "--arch",
        f"{tmp_path / 'arch.py'}:build",
        "--inputs",
        tmp_path / "in.safetensors",
    )
    assert res.code == 0
    assert res.report["bisect"]["keep_modules"] == []
    assert res.report["bisect"]["finite_after"] is True


def test_fails_even_in_fp32_exits_1(cli_main, stack6):
    d, _ = stack6
    res = cli_main(
        "bisect",
        d / "logneg.safetensors",
        "--arch",
        f"{MODELS / 'stack6.py'}:build_bad_everywhere",
        "--inputs",
        d / "in.safetensors",
    )
    assert res.code == 1
    assert res.report["bisect"]["finite_after"] is False
    assert "even with everything in fp32" in res.stdout


def test_over_inputs_names_failing_input(cli_main, stack6, tmp_path):
    d, _ = stack6
    # the hot blocks only overflow when x is large enough: 0.1 * 1e5 = 1e4 stays finite
    save_file({"x": torch.full((2, 8), 0.1)}, str(tmp_path / "small.safetensors"))
    res = cli_main(
        "bisect",
        d / "stack6.safetensors",
        "--arch",
        f"{MODELS / 'stack6.py'}:build",
        "--inputs",
        tmp_path / "small.safetensors",
        "--inputs",
        d / "in.safetensors",
        "--over",
        "inputs",
    )
    assert res.report["bisect"]["failing_inputs"] == [1]
    assert res.code == 0  # --over inputs answers which inputs fail: that is its verdict, not a failure
    assert "1 input(s) fail in fp16: #1" in res.stdout and "no module set" not in res.stdout


def _minilm(minilm_dir):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(minilm_dir), local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(str(minilm_dir), local_files_only=True)
    return model, tok


def test_apply_policy_on_real_minilm(minilm_dir, tmp_path):
    """One Linear scaled to overflow fp16; bisect's policy keeps the fp16 run finite."""
    model, tok = _minilm(minilm_dir)
    target = "encoder.layer.2.output.dense"  # the FFN down-projection
    with torch.no_grad():
        model.get_submodule(target).weight.mul_(3000.0)
    d = tmp_path / "minilm-hot"
    d.mkdir()
    model.save_pretrained(str(d), safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (d / f).write_bytes((minilm_dir / f).read_bytes())
    rep = nan_hunter.bisect(
        str(d),
        dtype="fp16",
        prompts=["the quick brown fox jumps over the lazy dog"],
        device="cpu",
        policy_out=str(tmp_path / "p.yaml"),
    )
    b = rep.bisect
    assert b.finite_after, rep.notes
    assert target in b.keep_modules
    assert b.runs <= run_bound(b.candidates, len(b.keep_modules)) + 3
    # the public API on a fresh full-precision copy
    fresh, _ = _minilm(minilm_dir)
    fresh.load_state_dict(model.state_dict())
    enc = tok("the quick brown fox jumps over the lazy dog", return_tensors="pt")
    plain16 = type(fresh).from_pretrained(str(d), local_files_only=True).eval().half()
    with torch.no_grad():
        assert not torch.isfinite(plain16(**enc).last_hidden_state).all()
    handle = nan_hunter.apply_policy(fresh, str(tmp_path / "p.yaml"))
    try:
        with torch.no_grad():
            out = fresh(**enc).last_hidden_state
    finally:
        handle.remove()
    assert torch.isfinite(out).all()
    assert out.dtype == torch.float16
    assert not math.isnan(float(out.float().abs().max()))


def _save_arch(tmp_path, source: str, inputs: dict) -> tuple[Path, Path, Path]:
    """A model file with build(), its weights and one input file, all under tmp_path."""
    import importlib.util

    arch = tmp_path / "arch.py"
    arch.write_text(source)
    spec = importlib.util.spec_from_file_location("arch_under_test", arch)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    save_file(mod.build().state_dict(), str(tmp_path / "w.safetensors"))
    save_file(inputs, str(tmp_path / "in.safetensors"))
    return tmp_path / "w.safetensors", arch, tmp_path / "in.safetensors"


CLAMPED = """
import torch
from torch import nn

class Clamped(nn.Module):
    # T5-style: the FFN output overflows fp16, then the block clamps it back into range,
    # so the model's own output is finite and equal to the fp32 run's.
    def __init__(self):
        super().__init__()
        self.wi = nn.Linear(4, 4, bias=False)
        self.wo = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.wi.weight.fill_(1.0)
            self.wo.weight.fill_(30000.0)

    def forward(self, x):
        return torch.clamp(self.wo(self.wi(x)), -60000.0, 60000.0)

def build():
    return Clamped()
"""


def test_a_module_output_that_went_inf_fails_even_when_the_output_is_clamped(cli_main, tmp_path):
    w, arch, inp = _save_arch(tmp_path, CLAMPED, {"x": torch.ones(1, 4)})
    res = cli_main("bisect", w, "--arch", f"{arch}:build", "--inputs", inp, "--dtype", "fp16")
    assert res.code == 0, res.stderr
    assert res.report["bisect"]["keep_modules"] == ["wo"]
    assert res.report["bisect"]["already_finite"] is False


PARENT_OP = """
import torch
from torch import nn

class Attn(nn.Module):
    # the overflowing op is written in this module's own forward (q·kᵀ-like), not in a leaf
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(4, 4, bias=False)
        self.k = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.q.weight.fill_(100.0)
            self.k.weight.fill_(100.0)

    def forward(self, x):
        return (self.q(x) * self.k(x)).softmax(-1)

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()
        self.out = nn.Linear(4, 4)

    def forward(self, x):
        return self.out(self.attn(x))

def build():
    return Model()
"""


def test_candidates_include_a_blamed_module_that_is_not_a_leaf(cli_main, tmp_path):
    w, arch, inp = _save_arch(tmp_path, PARENT_OP, {"x": torch.ones(1, 4)})
    res = cli_main("bisect", w, "--arch", f"{arch}:build", "--inputs", inp, "--dtype", "fp16")
    assert res.code == 0, res.stderr
    assert res.report["bisect"]["keep_modules"] == ["attn"]
    # an --arch model is no transformers model: its _keep_in_fp32_modules was never tried, so never printed
    assert res.report["bisect"]["keep_in_fp32_modules"] is None
    assert "_keep_in_fp32_modules" not in res.stdout and "attn → fp32" in res.stdout


HEAD = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return x + self.fc(x)

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.head.weight.fill_(40000.0)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

def build():
    torch.manual_seed(0)
    return Model()
"""


def test_block_granularity_includes_modules_outside_the_blocks(cli_main, tmp_path):
    w, arch, inp = _save_arch(tmp_path, HEAD, {"x": torch.full((1, 4), 5.0)})
    res = cli_main(
        "bisect", w, "--arch", f"{arch}:build", "--inputs", inp, "--dtype", "fp16", "--granularity", "block"
    )
    assert res.code == 0, res.stderr
    assert res.report["bisect"]["keep_modules"] == ["head"]
    assert res.report["weights"]["n_tensors"] == 7  # the bisect report carries the weights scan


def test_fp32_is_refused_and_a_finite_run_says_so(cli_main, tmp_path):
    w, arch, inp = _save_arch(tmp_path, HEAD.replace("fill_(40000.0)", "fill_(0.1)"), {"x": torch.ones(1, 4)})
    res = cli_main("bisect", w, "--arch", f"{arch}:build", "--inputs", inp, "--dtype", "fp32")
    assert res.code == 2 and "nothing to bisect" in res.stderr and "Traceback" not in res.stderr
    res = cli_main("bisect", w, "--arch", f"{arch}:build", "--inputs", inp, "--dtype", "fp16")
    assert res.code == 0, res.stderr
    b = res.report["bisect"]
    assert b["keep_modules"] == [] and b["already_finite"] is True
    assert any("already finite" in n for n in res.report["notes"])
