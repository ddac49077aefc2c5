"""Outputs: never onto an input, one stdout, atomic writes, Ctrl-C.

Which outputs are refused, and where output goes, is decided by the command itself: those cases
run ``main(argv)`` in-process (``run_main``). Failing writes (a file-size limit set in the child)
and Ctrl-C (a signal, the exit code 130) need the real CLI process (``run_cli``); interrupt cases
run a factory that never returns and send SIGINT once it has started.
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def one_error_line(res, *needles: str) -> str:
    assert res.code == 2, (res.code, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("nanhunter: error: "), res.stderr
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def leftovers(d: Path) -> list[str]:
    """Temporary files an output write could have left in ``d``."""
    return sorted(p.name for p in d.iterdir() if "nanhunter-tmp" in p.name)


@pytest.fixture
def model(overflow_model, tmp_path) -> dict[str, Path]:
    """The overflow model copied into its own directory (tests link to and hash its files)."""
    d = tmp_path / "ck"
    d.mkdir()
    out: dict[str, Path] = {}
    for key in ("ck", "inputs"):
        src = Path(overflow_model[key])
        (d / src.name).write_bytes(src.read_bytes())
        out[key] = d / src.name
    arch_src = Path(overflow_model["arch"].rpartition(":")[0])
    (d / "model.py").write_text(arch_src.read_text())
    out["arch_file"] = d / "model.py"
    out["dir"] = d
    return out


def bisect_args(m: dict[str, Path], *extra: object) -> list[object]:
    return [
        "bisect",
        m["ck"],
        "--arch",
        f"{m['arch_file']}:build",
        "--inputs",
        m["inputs"],
        "--dtype",
        "fp16",
        *extra,
    ]


def hashes(d: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(d.iterdir()) if p.is_file()}


# --- inputs are never outputs --------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--json", "--policy-out"])
@pytest.mark.parametrize("target", ["checkpoint", "symlink", "hardlink", "inputs", "arch", "config", "data"])
def test_output_onto_an_input_is_refused(run_main, model, tmp_path, flag, target):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("{}\n")
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hi"}\n')
    before = {**hashes(model["dir"]), "cfg": sha256(cfg), "data": sha256(data)}
    if target == "symlink":
        path = tmp_path / "link.json"
        path.symlink_to(model["ck"])
    elif target == "hardlink":
        path = tmp_path / "hard.json"
        os.link(model["ck"], path)
    else:
        path = {
            "checkpoint": model["ck"],
            "inputs": model["inputs"],
            "arch": model["arch_file"],
            "config": cfg,
            "data": data,
        }[target]
    extra = ["--config", cfg] if target == "config" else ["--data", data] if target == "data" else []
    res = run_main(*bisect_args(model, flag, path, *extra))
    one_error_line(res, flag, "is an input of this command")
    assert {**hashes(model["dir"]), "cfg": sha256(cfg), "data": sha256(data)} == before
    assert leftovers(model["dir"]) == [] and leftovers(tmp_path) == []


def test_directory_checkpoint_protects_every_file_it_reads(run_main, tmp_path):
    """A model directory: its config, weights and an index's shards are inputs; the directory
    itself is a directory; a new file beside them is fine (refused here only for its suffix)."""
    d = tmp_path / "hf"
    d.mkdir()
    save_file({"w": torch.ones(2)}, str(d / "model-00001-of-00001.safetensors"))
    (d / "model.safetensors.index.json").write_text(
        '{"weight_map": {"w": "model-00001-of-00001.safetensors"}}'
    )
    (d / "tokenizer.json").write_text("{}")
    before = hashes(d)
    for victim in ("model-00001-of-00001.safetensors", "model.safetensors.index.json", "tokenizer.json"):
        one_error_line(run_main("scan", d, "--json", d / victim), "is an input")
    one_error_line(run_main("scan", d, "--json", d), "is a directory")
    # the index as the checkpoint: its shards are inputs too
    one_error_line(
        run_main(
            "scan", d / "model.safetensors.index.json", "--json", d / "model-00001-of-00001.safetensors"
        ),
        "is an input",
    )
    assert hashes(d) == before
    res = run_main("scan", d, "--json", d / "report.json", "-q")
    assert res.code == 0, res.stderr
    assert (d / "report.json").is_file()


def test_check_protects_every_checkpoint(run_main, tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"w": torch.ones(2)}, str(a))
    save_file({"w": torch.ones(3)}, str(b))
    before = (sha256(a), sha256(b))
    one_error_line(run_main("check", a, b, "--junit", b), "--junit", "is an input")
    res = run_main("check", a, b, "--report", tmp_path / "b.md", "-q")  # its PNGs: b-1.png, b-2.png
    assert res.code == 0, res.stderr
    assert sorted(p.name for p in tmp_path.glob("b*")) == ["b-1.png", "b-2.png", "b.md", "b.safetensors"]
    assert (sha256(a), sha256(b)) == before


def test_markdown_png_beside_report_may_not_be_an_input(run_main, tmp_path):
    png = tmp_path / "r.png"
    save_file({"w": torch.ones(2)}, str(png))  # a checkpoint that happens to be named r.png
    one_error_line(run_main("scan", png, "--report", tmp_path / "r.md"), "--report", "r.png", "is an input")


# --- outputs among themselves ----------------------------------------------------------------------
@pytest.mark.parametrize("how", ["same path", "symlink", "hardlink"])
def test_two_outputs_may_not_be_one_file(run_main, model, tmp_path, how):
    a = tmp_path / "p.yaml"
    b = a
    if how != "same path":
        a.write_text("old\n")
        b = tmp_path / "other.yaml"
        (b.symlink_to(a) if how == "symlink" else os.link(a, b))
    one_error_line(run_main(*bisect_args(model, "--json", a, "--policy-out", b)), "same file as --json")


def test_only_one_output_takes_stdout(run_main, model, tmp_path):
    one_error_line(
        run_main(*bisect_args(model, "--json", "-", "--policy-out", "-"), cwd=tmp_path),
        "only one output can go to stdout",
    )
    assert not (tmp_path / "-").exists()


def test_report_cannot_go_to_stdout(run_main, model):
    one_error_line(run_main("scan", model["ck"], "--report", "-"), "--report")


def test_policy_to_stdout_is_yaml_and_view_goes_to_stderr(run_main, model, tmp_path):
    res = run_main(*bisect_args(model, "--policy-out", "-"), cwd=tmp_path)
    assert res.code == 0, res.stderr
    pol = yaml.safe_load(res.stdout)
    assert pol["nanhunter_policy"] == 1 and pol["dtype"] == "fp16" and pol["modules"] == {"down": "fp32"}
    assert not (tmp_path / "-").exists()
    assert "down" in res.stderr  # the terminal view moved to stderr


def test_junit_to_stdout(run_main, model):
    res = run_main("check", model["ck"], "--junit", "-", "-q")
    assert res.code == 0, res.stderr
    assert res.stdout.startswith('<?xml version="1.0" encoding="UTF-8"?>') and "<testsuites" in res.stdout


def test_output_directory_must_exist_and_output_must_be_a_regular_file(run_main, model, tmp_path):
    one_error_line(run_main("scan", model["ck"], "--json", tmp_path / "no" / "r.json"), "does not exist")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one_error_line(run_main("scan", model["ck"], "--json", fifo), "not a regular file")


def test_symlinked_output_is_written_through(run_main, model, tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    res = run_main("scan", model["ck"], "--json", link, "-q")
    assert res.code == 0, res.stderr
    assert link.is_symlink() and '"schema"' in real.read_text()


# --- atomic writes under a file-size limit -------------------------------------------------------
def limit_file_size(nbytes: int):
    """preexec_fn: writes past ``nbytes`` fail with EFBIG (SIGXFSZ ignored, as on a full disk)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return apply


@pytest.mark.parametrize("existing", [False, True])
def test_json_write_failing_midway_leaves_nothing(run_cli, model, tmp_path, existing):
    out = tmp_path / "r.json"
    if existing:
        out.write_text("previous\n")
    res = run_cli("scan", model["ck"], "--json", out, "-q", preexec_fn=limit_file_size(300))
    one_error_line(res, "--json", str(out), "cannot write")
    assert (out.read_text() == "previous\n") if existing else not out.exists()
    assert leftovers(tmp_path) == []


def test_policy_write_failing_midway_leaves_nothing(run_cli, model, tmp_path):
    out = tmp_path / "p.yaml"
    res = run_cli(*bisect_args(model, "--policy-out", out, "-q"), preexec_fn=limit_file_size(40))
    one_error_line(res, "--policy-out", "cannot write")
    assert not out.exists() and leftovers(tmp_path) == []


def test_junit_write_failing_midway_leaves_nothing(run_cli, model, tmp_path):
    out = tmp_path / "j.xml"
    res = run_cli("check", model["ck"], "--junit", out, "-q", preexec_fn=limit_file_size(100))
    one_error_line(res, "--junit", "cannot write")
    assert not out.exists() and leftovers(tmp_path) == []


# --- Ctrl-C ----------------------------------------------------------------------------------------
HANGING_ARCH = '''
import time
from pathlib import Path

MARK = Path(__file__).with_name("started")


def spin():
    MARK.write_text("x")
    while True:
        pass


def sleep():
    MARK.write_text("x")
    while True:
        time.sleep(0.01)


def swallow():
    """Catches KeyboardInterrupt and carries on: only the watchdog can end this."""
    MARK.write_text("x")
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass
'''


@pytest.mark.parametrize(
    "command, factory",
    [("scan", "spin"), ("scan", "sleep"), ("scan", "swallow"), ("bisect", "spin"), ("check", "sleep")],
)
def test_ctrl_c_exits_130_within_a_second(run_cli, model, tmp_path, command, factory):
    arch = tmp_path / "hang.py"
    arch.write_text(HANGING_ARCH)
    out = tmp_path / "r.json"
    args = [command, model["ck"], "--arch", f"{arch}:{factory}", "--inputs", model["inputs"], "--json", out]
    if command == "bisect":
        args += ["--policy-out", tmp_path / "p.yaml"]
    res = run_cli(*args, interrupt_when=tmp_path / "started", timeout=120)
    assert res.code == 130, res.stderr
    assert res.interrupt_s is not None and res.interrupt_s < 1.0, res.interrupt_s
    assert res.stderr.strip().splitlines()[-1] == "nanhunter: interrupted"
    assert "Traceback" not in res.stderr
    assert not out.exists() and not (tmp_path / "p.yaml").exists() and leftovers(tmp_path) == []


# --- a reader of stdout that goes away (`nanhunter scan X | head -1`) ------------------------------
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _ok(res, want: int) -> None:
    """The verdict's exit code (never 1 or 2 for the closed pipe itself), no traceback, no error line."""
    assert res.code == want, (res.code, res.stderr)
    for bad in ("Traceback", "nanhunter: error", "internal error"):
        assert bad not in res.stderr, res.stderr


@pytest.mark.parametrize("read_lines", [0, 1], ids=["closed-at-once", "head-1"])
def test_closed_stdout_keeps_the_verdicts_exit_code_scan(run_cli, model, tmp_path, read_lines):
    """issue 31 (6): rich ended the process with exit 1 ("non-finite found") when stdout closed."""
    res = run_cli("scan", EXAMPLES / "clean.safetensors", reader_leaves_after=read_lines)
    _ok(res, 0)
    assert res.stderr == ""
    # a real finding keeps its exit 1, and the outputs that are files are still written
    js = tmp_path / "r.json"
    res = run_cli(
        "scan",
        model["ck"],
        "--arch",
        f"{model['arch_file']}:build",
        "--inputs",
        model["inputs"],
        "--dtype",
        "fp16",
        "--json",
        js,
        reader_leaves_after=read_lines,
    )
    _ok(res, 1)
    assert js.exists() and '"first_nonfinite"' in js.read_text()


@pytest.mark.parametrize(
    "args, want",
    [
        (["scan", "{clean}", "--json", "-"], 0),  # the report to stdout, the view to stderr
        (["check", "{clean}"], 0),
        (["check", "{clean}", "--junit", "-"], 0),
        (["bisect", "{ck}", "--arch", "{arch}", "--inputs", "{inputs}", "--dtype", "fp16"], 0),
        (
            [
                "bisect",
                "{ck}",
                "--arch",
                "{arch}",
                "--inputs",
                "{inputs}",
                "--dtype",
                "fp16",
                "--policy-out",
                "-",
            ],
            0,
        ),
        (["bisect", "{ck}", "--arch", "{arch}", "--inputs", "{inputs}", "--dtype", "fp16", "--json", "-"], 0),
    ],
    ids=["scan-json", "check", "check-junit", "bisect", "bisect-policy", "bisect-json"],
)
def test_closed_stdout_keeps_the_verdicts_exit_code(run_cli, model, args, want):
    fill = {
        "clean": EXAMPLES / "clean.safetensors",
        "ck": model["ck"],
        "arch": f"{model['arch_file']}:build",
        "inputs": model["inputs"],
    }
    _ok(run_cli(*[str(a).format(**fill) for a in args], reader_leaves_after=0), want)


def test_closed_stdout_check_with_annotations_fails_only_on_its_rule(run_cli):
    """A failing check is exit 1 because a rule failed; its GitHub annotations to a closed stdout
    change nothing."""
    env = {"GITHUB_ACTIONS": "true"}
    _ok(run_cli("check", EXAMPLES / "corrupt.safetensors", reader_leaves_after=0, env=env), 1)
    _ok(run_cli("check", EXAMPLES / "clean.safetensors", reader_leaves_after=0, env=env), 0)
