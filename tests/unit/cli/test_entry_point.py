"""The ``nanhunter`` entry point: usage errors in one line, ``--version`` for bug reports, and
start-up that imports only what the command needs (``nanhunter --help`` without torch; a
weights-only scan or check without torch, pydantic, matplotlib or transformers: numpy reads the weights).
How long ``--help`` takes is measured by ``bench/help_time.py`` (a speed target is a benchmark's, not a
timed test's).

What the command says runs in this process (``invoke``); a real process where it is the point: a
closed pipe, what start-up imports (tests/integration/test_bad_input.py has exit 2 from the
console script)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from clirun import ROOT, invoke
from safetensors.torch import save_file

from nan_hunter import __version__


@pytest.mark.parametrize(
    "args, says",
    [
        (["scan"], "the following arguments are required: checkpoint"),
        (["scan", "x.safetensors", "--bogus"], "unrecognized arguments: --bogus"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["bisect", "x.safetensors", "--rtol", "abc"], "--rtol: invalid float value: 'abc'"),
        (["scan", "x.safetensors", "--generate", "1.5"], "argument --generate: invalid int value: '1.5'"),
        (["check"], "the following arguments are required: CHECKPOINT"),
        (["diff"], "the following arguments are required: A, B"),
        (
            ["bisect", "x.safetensors", "--policy", "p.yaml"],
            "unrecognized arguments: --policy",
        ),  # no abbreviations
        (["scan", "x.safetensors", "--dtype"], "argument --dtype: expected one argument"),
        (["scan", "x.safetensors", "--quiet=yes"], "argument --quiet: ignored explicit argument 'yes'"),
        (["scan", "x.safetensors", "y.safetensors"], "unrecognized arguments: y.safetensors"),
    ],
)
def test_usage_errors_are_one_line(args, says):
    code, out, err = invoke(*args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nanhunter: error: ") and says in lines[0], err
    assert "--help" in lines[0] and out == ""


def test_version_names_what_a_bug_report_needs():
    code, out, err = invoke("--version")
    lines = out.splitlines()
    assert code == 0 and err == "" and lines[0].split() == ["nanhunter", __version__]
    names = [line.split()[0] for line in lines]
    assert names == [
        "nanhunter",
        "Python",
        "torch",
        "transformers",
        "accelerate",
        "lightning",
        "triton",
        "safetensors",
    ]
    torch_line = lines[2]
    assert torch.__version__ in torch_line and "device:" in torch_line
    # the build label says what torch was compiled for (a CUDA wheel on a machine without a GPU is
    # still a CUDA build); the device says what it sees now
    hip, cuda = getattr(torch.version, "hip", None), getattr(torch.version, "cuda", None)
    build = f"(ROCm {hip})" if hip else f"(CUDA {cuda})" if cuda else "(CPU only)"
    assert build in torch_line
    if not torch.cuda.is_available():
        assert "device: none (CPU)" in torch_line or "device: Apple MPS" in torch_line
    assert sys.version.split()[0] in lines[1]


def test_version_says_absent_libraries_are_absent(monkeypatch):
    from importlib import metadata

    from nan_hunter.cli import about

    real = metadata.version

    def version(dist):
        if dist in ("triton", "lightning", "pytorch-lightning"):
            raise metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(metadata, "version", version)
    lines = {line.split()[0]: line for line in about.version_lines()}
    assert lines["triton"].split(None, 1)[1] == "not installed"
    assert lines["lightning"].split(None, 1)[1] == "not installed"


def test_no_command_prints_help_and_exits_2():
    code, out, err = invoke()
    assert code == 2 and "scan" in err and "bisect" in err and "check" in err


@pytest.mark.parametrize("command", ["scan", "bisect", "check", "diff"])
def test_every_command_has_help(command):
    code, out, _ = invoke(command, "--help")
    assert code == 0 and f"Usage: nanhunter {command}" in out and "--json" in out


def test_help_into_a_closed_pipe_is_not_an_error(run_cli):
    res = run_cli("scan", "--help", reader_leaves_after=1)
    assert res.code == 0 and res.stderr == ""


def imported(run_cli, *args: object, codes: tuple[int, ...] = (0,)) -> set[str]:
    """Top-level packages a real ``nanhunter ARGS`` imported (``-X importtime`` through its
    environment variable); the command must exit with one of ``codes``."""
    code, _, err = run_cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert code in codes, err[-2000:]
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", err, flags=re.M)
    assert names, err[-2000:]
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("args", [["--help"], ["scan", "--help"], ["check", "--help"]])
def test_help_imports_no_heavy_package(run_cli, args):
    mods = imported(run_cli, *args)
    assert "typer" in mods and "rich" in mods  # the help is typer's, drawn with rich
    assert not mods & {"torch", "yaml", "pydantic", "numpy", "safetensors"}, mods


def test_version_imports_torch_but_not_the_libraries_it_names(run_cli):
    mods = imported(run_cli, "--version")
    assert "torch" in mods and not mods & {"transformers", "lightning", "accelerate", "rich"}, mods


EDGE_CASES = (
    ROOT / "tests" / "data" / "dtypes" / "edge_cases.safetensors"
)  # every safetensors dtype, NaN/Inf too
GPTQ_FILE = ROOT / "tests" / "data" / "quant" / "gptq_4bit_sym_v1" / "model.safetensors"


def _weights_only_checkpoints(tmp_path) -> dict[str, tuple[Path, int]]:
    """Checkpoints scanned weights-only (no --arch, no config.json), each with the exit code it gives."""
    save_file({"w": torch.ones(4)}, str(tmp_path / "w.safetensors"))
    shards = tmp_path / "sharded"
    shards.mkdir()
    save_file({"a": torch.ones(3, dtype=torch.bfloat16)}, str(shards / "s1.safetensors"))
    save_file({"b": torch.full((2,), float("nan"))}, str(shards / "s2.safetensors"))
    (shards / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})
    )
    plain_dir = tmp_path / "dir"  # a directory of safetensors without config.json
    plain_dir.mkdir()
    save_file({"x": torch.ones(2, dtype=torch.float16)}, str(plain_dir / "x.safetensors"))
    w = (torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) * 50).to(torch.float8_e4m3fn)
    scale = torch.full((2, 2), 0.01)
    scale[1, 0] = float("nan")
    save_file({"l.weight": w, "l.weight_scale_inv": scale}, str(tmp_path / "fp8_block.safetensors"))
    out = {
        "plain": (tmp_path / "w.safetensors", 0),
        "every dtype": (EDGE_CASES, 1),
        "sharded": (shards / "model.safetensors.index.json", 1),
        "directory": (plain_dir, 0),
        "fp8 block scales": (tmp_path / "fp8_block.safetensors", 1),
        "gptq": (GPTQ_FILE, 0),
    }
    try:
        import gguf
        from gguf.quants import quantize
    except ImportError:
        return out
    g = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    data = np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64)
    q8 = quantize(data, gguf.GGMLQuantizationType.Q8_0)
    g.add_tensor("blk.0.w", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    g.add_tensor("blk.0.n", data[0])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    out["gguf"] = (tmp_path / "q.gguf", 0)
    return out


def test_weights_only_scan_and_check_never_import_torch(run_cli, tmp_path):
    """A weights-only scan or check (no model to run) reads every checkpoint kind with numpy alone:
    safetensors of every dtype, a sharded index, a directory, quantized weights with their scales, GGUF,
    fast and ``--stats full``, JSON and JUnit written."""
    for kind, (ck, code) in _weights_only_checkpoints(tmp_path).items():
        for args in (
            ["scan", ck, "--json", tmp_path / "r.json", "-q"],
            ["scan", ck, "--stats", "full", "--json", tmp_path / "r.json"],
            ["check", ck, "--json", tmp_path / "c.json", "--junit", tmp_path / "c.xml"],
        ):
            mods = imported(run_cli, *args, codes=(code,))
            assert "torch" not in mods and "numpy" in mods, (kind, args[0])
            assert not mods & {"pydantic", "matplotlib", "transformers", "triton"}, (kind, mods)
        rep = json.loads((tmp_path / "r.json").read_text())
        assert rep["run"] is None and rep["torch_version"] == torch.__version__, (
            kind
        )  # said without loading it


def test_a_model_run_and_a_torch_file_still_import_torch(run_cli, tmp_path):
    """torch is imported where it is needed: a ``torch.save`` file, and a run of a model."""
    torch.save({"w": torch.ones(3)}, tmp_path / "w.pt")
    assert "torch" in imported(run_cli, "scan", tmp_path / "w.pt", "-q")
    arch = tmp_path / "arch.py"
    arch.write_text("import torch\ndef build():\n    return torch.nn.Linear(2, 2)\n")
    save_file(torch.nn.Linear(2, 2).state_dict(), str(tmp_path / "lin.safetensors"))
    save_file({"input": torch.ones(1, 2)}, str(tmp_path / "x.safetensors"))
    mods = imported(
        run_cli,
        "scan",
        tmp_path / "lin.safetensors",
        "--arch",
        f"{arch}:build",
        "--inputs",
        tmp_path / "x.safetensors",
        "-q",
    )
    assert "torch" in mods


def test_a_bad_device_is_refused_without_a_model_too(run_cli, tmp_path):
    """``--device`` is checked as before on a weights-only scan (exit 2, one line), torch or not."""
    save_file({"w": torch.ones(4)}, str(tmp_path / "w.safetensors"))
    code, _, err = run_cli("scan", tmp_path / "w.safetensors", "--device", "tpu")
    assert code == 2 and err.strip().splitlines() == [
        "nanhunter: error: --device 'tpu': use auto, cpu or cuda"
    ]
    code, _, err = run_cli("scan", tmp_path / "w.safetensors", "--device", "cuda")
    if torch.cuda.is_available():
        assert code == 0
    else:
        assert (
            code == 2
            and "--device cuda: no CUDA device available" in err
            and len(err.strip().splitlines()) == 1
        )
