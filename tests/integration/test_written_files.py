"""Nothing hidden (issue 32, item 4): every file a command writes is announced on stderr with its
path once the command is done (``nanhunter: wrote r.html (--report)``), and an output asked for but
not written says why; stdout (``-``) is not a file, and ``--quiet`` says nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny-llama-fp16"
FAULTY_PROMPT = "the quick brown fox"


def _wrote(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("nanhunter: wrote ")]


def test_scan_announces_json_report_pngs_and_trace(run_main, tmp_path):
    code, out, err = run_main(
        "scan",
        TINY,
        "--prompt",
        FAULTY_PROMPT,
        "--dtype",
        "fp16",
        "--json",
        tmp_path / "r.json",
        "--report",
        tmp_path / "r.md",
        "--trace",
        tmp_path / "t.jsonl",
        cwd=tmp_path,
    )
    assert code == 1
    assert _wrote(err) == [
        f"nanhunter: wrote {tmp_path / 't.jsonl'} (--trace)",  # during the run
        f"nanhunter: wrote {tmp_path / 'r.json'} (--json)",
        f"nanhunter: wrote {tmp_path / 'r.png'} (--report)",
        f"nanhunter: wrote {tmp_path / 'r.md'} (--report)",
    ]
    assert all((tmp_path / n).is_file() for n in ("r.json", "r.md", "r.png", "t.jsonl"))
    assert err.splitlines()[-1].startswith("nanhunter: wrote "), err  # after the terminal view, not inside it


def test_html_report_is_announced_and_quiet_says_nothing(run_main, tmp_path):
    ck = ROOT / "examples" / "clean.safetensors"
    code, _, err = run_main("scan", ck, "--report", tmp_path / "r.html", cwd=tmp_path)
    assert code == 0 and _wrote(err) == [f"nanhunter: wrote {tmp_path / 'r.html'} (--report)"]
    code, out, err = run_main(
        "scan", ck, "--report", tmp_path / "q.html", "--json", tmp_path / "q.json", "-q", cwd=tmp_path
    )
    assert code == 0 and err == "" and out == "" and (tmp_path / "q.html").is_file()


def test_stdout_is_not_announced(run_main, tmp_path):
    code, out, err = run_main("scan", ROOT / "examples" / "clean.safetensors", "--json", "-", cwd=tmp_path)
    assert code == 0 and out.lstrip().startswith("{") and _wrote(err) == []


def test_check_announces_junit_and_json(run_main, tmp_path):
    code, _, err = run_main(
        "check",
        ROOT / "examples" / "clean.safetensors",
        "--junit",
        tmp_path / "j.xml",
        "--json",
        tmp_path / "c.json",
        cwd=tmp_path,
    )
    assert code == 0
    assert _wrote(err) == [
        f"nanhunter: wrote {tmp_path / 'c.json'} (--json)",
        f"nanhunter: wrote {tmp_path / 'j.xml'} (--junit)",
    ]


@pytest.mark.parametrize("prompt, written", [(FAULTY_PROMPT, True), ("hi", False)])
def test_bisect_policy_is_announced_or_its_absence_explained(run_main, tmp_path, prompt, written):
    policy = tmp_path / "keep.yaml"
    code, _, err = run_main(
        "bisect", TINY, "--prompt", prompt, "--dtype", "fp16", "--policy-out", policy, cwd=tmp_path
    )
    assert code == 0 and policy.is_file() is written
    if written:
        assert _wrote(err) == [f"nanhunter: wrote {policy} (--policy-out)"]
    else:
        assert err.splitlines()[-1] == (
            f"nanhunter: --policy-out {policy}: not written: the run in fp16 is already "
            "finite: there is nothing to keep in fp32"
        )
