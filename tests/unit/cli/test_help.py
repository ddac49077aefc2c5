"""Help that teaches: options grouped by purpose, real metavars, help and defaults for every
option, an examples section per command, "did you mean" for a mistyped option."""

from __future__ import annotations

import argparse
import re

import pytest

from nan_hunter.cli.main import build_parser
from nan_hunter.cli.options import did_you_mean

COMMANDS = ["scan", "bisect", "check"]


def _sub(name: str) -> argparse.ArgumentParser:
    p = build_parser()
    action = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_a_real_metavar_and_a_group(command):
    p = _sub(command)
    for a in p._actions:
        if not a.option_strings or a.dest == "help":
            continue
        assert a.help, a.option_strings
        if a.nargs != 0:  # takes a value: the metavar says what, not the dest in capitals
            assert a.metavar and a.metavar != a.dest.upper(), a.option_strings
    groups = {g.title: g for g in p._action_groups}
    assert {"model", "inputs", "precision and device", "what to run", "output"} <= set(groups)
    assert not [a for a in groups["options"]._group_actions if a.dest != "help"]  # nothing left ungrouped


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_defaults_and_examples(command):
    text = _sub(command).format_help()
    assert "examples:" in text and f"nanhunter {command} " in text.split("examples:")[1]
    assert not re.search(r"--[a-z-]+ [A-Z_]{4,}\b", text.replace("FILE", "").replace("PATH", "")
                         .replace("TEXT", "").replace("FLOAT", "").replace("FACTORY", "").replace("SIZE", "")
                         .replace("DTYPE", ""))


def test_scan_help_states_the_rtol_and_backend_defaults():
    text = " ".join(_sub("scan").format_help().split())
    assert "(default: 0.01)" in text and "(default: inductor)" in text and "(default: fast)" in text


def test_bisect_keep_dtype_and_granularity_have_help():
    text = " ".join(_sub("bisect").format_help().split())
    assert "--keep-dtype fp32|bf16 the precision kept modules run in (default: fp32)" in text
    assert "--granularity leaf|block candidates: leaf modules" in text


@pytest.mark.parametrize("typed, meant", [("--dtpye", "--dtype"), ("--promt", "--prompt"),
                                          ("--compile-bakend", "--compile-backend"),
                                          ("--html", "--report"), ("--precision", "--dtype")])
def test_did_you_mean(typed, meant):
    names = build_parser().option_names()
    assert did_you_mean(f"unrecognized arguments: {typed} fp16", names) == f"; did you mean {meant}?"


def test_no_suggestion_for_nonsense():
    assert did_you_mean("unrecognized arguments: --zzzzzzzz", build_parser().option_names()) == ""


def test_mistyped_option_exits_2_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["scan", "x.safetensors", "--dtpye", "fp16"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "did you mean --dtype?" in err
