"""``torchrun --nproc-per-node 2 -m nan_hunter scan|check``: the data set split across two real
gloo ranks on CPU (docs/contract.md, "Distributed"). Rank 0's report must be the one a single
process writes (except ``first_nonfinite.rank`` and notes), every rank exits with the global
code, only rank 0 writes, and a bad input on one rank ends both with exit 2 in one line.

Each rank runs the real ``python -m nan_hunter`` in the environment torchrun gave it; a small
launcher around it records that rank's exit code, stdout and stderr (torchrun itself reports
only failures, in a format of its own)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from clirun import cli_env, run_cli
from safetensors.torch import save_file

pytestmark = pytest.mark.slow  # each test starts two ranks (and often one single process): ~20 s apiece

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llama-fp16"
# Prompts with "the" or a digit overflow the example's layer 1 MLP in fp16: #2 fails first, #4 too.
DATA = [
    "a cat sat on a mat",
    "hello world",
    "the quick brown fox",
    "good morning everyone",
    "we shipped 3 models",
]
FAILED = [2, 4]

LAUNCHER = """
import json, os, subprocess, sys
out_dir, args = sys.argv[1], sys.argv[2:]
p = subprocess.run([sys.executable, "-m", "nan_hunter", *args], capture_output=True, text=True)
with open(os.path.join(out_dir, "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"code": p.returncode, "stdout": p.stdout, "stderr": p.stderr,
               "world": os.environ["WORLD_SIZE"]}, f)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(tmp: Path, *args: object, nproc: int = 2, timeout: float = 240) -> list[dict]:
    """Run ``nanhunter ARGS`` on ``nproc`` gloo ranks; per rank: {code, stdout, stderr}."""
    ranks = tmp / "ranks"
    ranks.mkdir(exist_ok=True)
    launcher = tmp / "launch_rank.py"
    launcher.write_text(LAUNCHER)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(launcher),
        str(ranks),
        *map(str, args),
    ]
    env = cli_env({"OMP_NUM_THREADS": 1, "NANHUNTER_DIST_TIMEOUT": 120})
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"torchrun did not finish within {timeout} s (a hang across ranks)")
    assert proc.returncode == 0, err[-3000:]  # the launchers themselves always exit 0
    got = [json.loads((ranks / f"rank{r}.json").read_text()) for r in range(nproc)]
    assert all(g["world"] == str(nproc) for g in got)
    return got


def normalized(rep: object) -> object:
    """The report without what may differ between one process and K ranks: notes and the rank (and
    ``run.command``, the command line as run: the two runs write their reports to different paths)."""
    if isinstance(rep, dict):
        return {k: normalized(v) for k, v in rep.items() if k not in ("notes", "rank", "command")}
    if isinstance(rep, list):
        return [normalized(v) for v in rep]
    return rep


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("split") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in DATA))
    return path


def test_scan_split_matches_one_process(data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    one = run_cli("scan", EXAMPLE, "--data", data, "--dtype", "fp16", "--json", tmp_path / "one.json")
    assert one.code == 1, one.stderr
    ranks = torchrun(
        tmp_path, "scan", EXAMPLE, "--data", data, "--dtype", "fp16", "--json", out / "report.json"
    )
    assert [r["code"] for r in ranks] == [1, 1], [r["stderr"][-2000:] for r in ranks]
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]  # rank 1 wrote nothing, no temporaries
    assert ranks[1]["stdout"] == "" and ranks[1]["stderr"] == ""
    assert "model.layers.1.mlp.down_proj" in ranks[0]["stdout"]  # rank 0 printed the terminal report
    single = json.loads((tmp_path / "one.json").read_text())
    split = json.loads((out / "report.json").read_text())
    assert single["run"]["failed_inputs"] == split["run"]["failed_inputs"] == FAILED
    assert single["first_nonfinite"]["rank"] is None
    assert split["first_nonfinite"]["rank"] == 1  # inputs #2-#4 ran on rank 1
    assert split["first_nonfinite"]["input_index"] == 2
    assert len(split["modules"]) == len(single["modules"]) > 0
    assert normalized(split) == normalized(single)
    assert any("split across 2 ranks" in n for n in split["notes"])


def test_scan_split_clean_data_exit_0(data, tmp_path):
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(json.dumps({"text": t}) + "\n" for i, t in enumerate(DATA) if i not in FAILED))
    one = run_cli("scan", EXAMPLE, "--data", clean, "--dtype", "fp16", "--json", tmp_path / "one.json")
    assert one.code == 0, one.stderr
    ranks = torchrun(tmp_path, "scan", EXAMPLE, "--data", clean, "--dtype", "fp16", "--json", "-", "-q")
    assert [r["code"] for r in ranks] == [0, 0], [r["stderr"][-2000:] for r in ranks]
    assert ranks[1]["stdout"] == ""
    split = json.loads(ranks[0]["stdout"])
    assert split["first_nonfinite"] is None and split["run"]["failed_inputs"] == []
    assert normalized(split) == normalized(json.loads((tmp_path / "one.json").read_text()))


def test_check_split_matches_one_process(data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    one = run_cli(
        "check", EXAMPLE, "--data", data, "--json", tmp_path / "one.json", "--junit", tmp_path / "one.xml"
    )
    assert one.code == 1, one.stderr
    ranks = torchrun(
        tmp_path,
        "check",
        EXAMPLE,
        "--data",
        data,
        "--json",
        out / "report.json",
        "--junit",
        out / "junit.xml",
    )
    assert [r["code"] for r in ranks] == [1, 1], [r["stderr"][-2000:] for r in ranks]
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "report.json"]
    assert ranks[1]["stdout"] == "" and ranks[1]["stderr"] == ""
    single = json.loads((tmp_path / "one.json").read_text())
    split = json.loads((out / "report.json").read_text())
    assert split["check"]["passed"] is False
    assert split["check"]["runs"]["fp16"]["failed_inputs"] == FAILED
    assert split["check"]["runs"]["fp16"]["first_nonfinite"]["rank"] == 1
    assert normalized(split) == normalized(single)
    assert (out / "junit.xml").read_text() == (tmp_path / "one.xml").read_text()


def test_bad_input_on_one_rank_exits_2_on_every_rank(tmp_path):
    """Input #1 (rank 1's) holds a token id beyond the vocabulary: the model raises on rank 1
    only; both ranks must agree, exit 2 with the same single line, and nobody may hang."""
    good, bad = tmp_path / "good.safetensors", tmp_path / "bad.safetensors"
    save_file({"input_ids": torch.tensor([[1, 5, 6, 7]])}, str(good))
    save_file({"input_ids": torch.tensor([[1, 5, 100000, 7]])}, str(bad))
    out = tmp_path / "out"
    out.mkdir()
    ranks = torchrun(
        tmp_path,
        "scan",
        EXAMPLE,
        "--inputs",
        good,
        "--inputs",
        bad,
        "--dtype",
        "fp16",
        "--json",
        out / "report.json",
    )
    assert [r["code"] for r in ranks] == [2, 2], [r["stderr"][-2000:] for r in ranks]
    lines = [r["stderr"].strip().splitlines() for r in ranks]
    assert all(len(x) == 1 for x in lines), lines
    assert lines[0] == lines[1] and lines[0][0].startswith("nanhunter: error: rank 1: the model raised")
    assert [r["stdout"] for r in ranks] == ["", ""]
    assert list(out.iterdir()) == []
