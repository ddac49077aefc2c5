"""cli/check_cmd.py: ``nanhunter check`` as its function — exit 0 only when every rule passed,
JSON (an array for several checkpoints) and JUnit written, GitHub annotations inside Actions only
(on stdout, or stderr when a file takes stdout), and the baseline protected from every output."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.cli import check_cmd
from nan_hunter.errors import BadInput


@pytest.fixture
def cks(tmp_path):
    save_file({"lin.weight": torch.full((4, 4), 0.25)}, str(tmp_path / "clean.safetensors"))
    w = torch.full((4, 4), 0.25)
    w[1, 2] = float("nan")
    save_file({"lin.weight": w}, str(tmp_path / "nan.safetensors"))
    return str(tmp_path / "clean.safetensors"), str(tmp_path / "nan.safetensors")


def test_exit_codes_and_files(cks, tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    clean, bad = cks
    assert check_cmd.command([clean], quiet=True) == 0
    code = check_cmd.command(
        [clean, bad], json=str(tmp_path / "r.json"), junit=str(tmp_path / "j.xml"), quiet=True
    )
    assert code == 1
    assert [r["check"]["passed"] for r in json.loads((tmp_path / "r.json").read_text())] == [True, False]
    assert (tmp_path / "j.xml").read_text().count("<testsuite ") == 2


@pytest.mark.parametrize("json_to, where", [(None, "out"), ("-", "err")])
def test_annotations_inside_actions(cks, capsys, monkeypatch, json_to, where):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    check_cmd.command([cks[1]], json=json_to, quiet=True)
    streams = dict(zip(("out", "err"), capsys.readouterr()))
    assert streams[where].startswith(f"::error file={cks[1]},title=nanhunter weights.nonfinite::")
    if json_to == "-":
        assert json.loads(streams["out"])["check"]["passed"] is False


def test_no_annotations_outside_actions(cks, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    check_cmd.command([cks[1]], quiet=True)
    assert "::error" not in capsys.readouterr().out


def test_no_output_may_overwrite_the_baseline(cks, tmp_path):
    with pytest.raises(BadInput, match="is an input"):
        check_cmd.command([cks[0]], baseline=cks[1], junit=cks[1])


def test_description_states_the_exit_codes():
    assert (
        "Exit 0: every rule passed" in check_cmd.DESCRIPTION and "::error/::warning" in check_cmd.DESCRIPTION
    )
