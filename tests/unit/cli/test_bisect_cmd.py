"""cli/bisect_cmd.py: ``nanhunter bisect`` as its function — the keep set and its policy file, the
JSON, the view (on stderr when a file takes stdout), and a ``--policy-out`` that was not written
said with the reason."""

from __future__ import annotations

import json

import pytest
import yaml

from nan_hunter.cli import bisect_cmd
from nan_hunter.errors import BadInput


def _model(m: dict) -> dict:
    return {"checkpoint": m["ck"], "arch": m["arch"], "inputs": [m["inputs"]]}


def test_keep_set_policy_and_json(overflow_model, tmp_path, capsys):
    code = bisect_cmd.command(
        **_model(overflow_model),
        dtype="fp16",
        policy_out=str(tmp_path / "p.yaml"),
        json=str(tmp_path / "r.json"),
        quiet=True,
    )
    assert code == 0 and capsys.readouterr().out == ""
    assert json.loads((tmp_path / "r.json").read_text())["bisect"]["keep_modules"] == ["down"]
    assert "down" in json.dumps(yaml.safe_load((tmp_path / "p.yaml").read_text()))


def test_the_view_and_the_policy_to_stdout(overflow_model, capsys):
    assert bisect_cmd.command(**_model(overflow_model), dtype="fp16", policy_out="-") == 0
    out, err = capsys.readouterr()
    assert "down" in json.dumps(yaml.safe_load(out))  # stdout: the policy alone
    assert "keep down → fp32" in err and err.splitlines()[-1].startswith("✔ keep 1 module(s) in fp32")


@pytest.mark.parametrize(
    "dtype, why",
    [
        ("bf16", "the run in bf16 is already finite: there is nothing to keep in fp32"),
    ],
)
def test_a_policy_not_written_says_why(overflow_model, tmp_path, capsys, dtype, why):
    p = tmp_path / "p.yaml"
    bisect_cmd.command(**_model(overflow_model), dtype=dtype, policy_out=str(p))
    assert not p.exists()
    assert f"nanhunter: --policy-out {p}: not written: {why}" in capsys.readouterr().err


def test_two_outputs_onto_stdout_are_refused(overflow_model):
    with pytest.raises(BadInput, match="stdout"):
        bisect_cmd.command(**_model(overflow_model), json="-", policy_out="-")


def test_examples_are_bisect_commands():
    assert all(cmd.startswith("nanhunter bisect ") for _, cmd in bisect_cmd.EXAMPLES)
