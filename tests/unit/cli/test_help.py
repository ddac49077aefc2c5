"""The typer CLI keeps every flag of v1–v1.2 as it was (names, kinds, defaults: the table below is
the argparse parser's, read before the move), and teaches: options in help panels by purpose, a
metavar and help for each, defaults stated, examples per command, "did you mean" for a mistyped
option (click's parser, the project's synonyms). The help is the real command's, run in this
process (``invoke``)."""

from __future__ import annotations

import pytest
from clirun import invoke

from nan_hunter.cli import bisect_cmd, check_cmd, diff_cmd, scan_cmd
from nan_hunter.cli.app import build_command
from nan_hunter.cli.main import main
from nan_hunter.pipeline.options import closest

COMMANDS = {"scan": scan_cmd, "bisect": bisect_cmd, "check": check_cmd, "diff": diff_cmd}
POSITIONALS = {"scan": ["ck"], "bisect": ["ck"], "check": ["ck"], "diff": ["a", "b"]}

#: (flags, dest, kind, default) of every option of v1.2's argparse parser, per command
V12 = {
    "scan": [
        (("--arch",), "arch", "value", None),
        (("--inputs",), "inputs", "repeat", None),
        (("--prompt",), "prompt", "repeat", None),
        (("--data",), "data", "value", None),
        (("--device",), "device", "value", "auto"),
        (("--attn",), "attn", "value", None),
        (("--dtype",), "dtype", "value", None),
        (("--device-map",), "device_map", "value", None),
        (("--max-memory",), "max_memory", "repeat", None),
        (("--stats",), "stats", "value", "fast"),
        (("--no-replay",), "no_replay", "flag", False),
        (("--compile",), "compile", "flag", False),
        (("--compile-backend",), "compile_backend", "value", "inductor"),
        (("--rtol",), "rtol", "float", 0.01),
        (("--generate",), "generate", "int", None),
        (("--batch",), "batch", "flag", False),
        (("--backward",), "backward", "flag", False),
        (("--loss",), "loss", "value", None),
        (("--trace",), "trace", "value", None),
        (("--trace-level",), "trace_level", "value", "modules"),
        (("--repeat",), "repeat", "int", None),
        (("--json",), "json", "value", None),
        (("--report",), "report", "value", None),
        (("--strip", "--no-strip"), "strip", "flag", None),
        (("--quiet", "-q"), "quiet", "flag", False),
        (("--config",), "config", "value", None),
    ],
    "bisect": [
        (("--arch",), "arch", "value", None),
        (("--inputs",), "inputs", "repeat", None),
        (("--prompt",), "prompt", "repeat", None),
        (("--data",), "data", "value", None),
        (("--device",), "device", "value", "auto"),
        (("--attn",), "attn", "value", None),
        (("--dtype",), "dtype", "value", "fp16"),
        (("--keep-dtype",), "keep_dtype", "value", "fp32"),
        (("--granularity",), "granularity", "value", None),
        (("--over",), "over", "value", "modules"),
        (("--rtol",), "rtol", "float", None),
        (("--generate",), "generate", "int", None),
        (("--backward",), "backward", "flag", False),
        (("--loss",), "loss", "value", None),
        (("--json",), "json", "value", None),
        (("--policy-out",), "policy_out", "value", None),
        (("--quiet", "-q"), "quiet", "flag", False),
        (("--config",), "config", "value", None),
    ],
    "check": [
        (("--arch",), "arch", "value", None),
        (("--inputs",), "inputs", "repeat", None),
        (("--prompt",), "prompt", "repeat", None),
        (("--data",), "data", "value", None),
        (("--device",), "device", "value", "auto"),
        (("--attn",), "attn", "value", None),
        (("--baseline",), "baseline", "value", None),
        (("--dtypes",), "dtypes", "value", None),
        (("--generate",), "generate", "int", None),
        (("--batch",), "batch", "flag", False),
        (("--json",), "json", "value", None),
        (("--junit",), "junit", "value", None),
        (("--report",), "report", "value", None),
        (("--strip", "--no-strip"), "strip", "flag", None),
        (("--quiet", "-q"), "quiet", "flag", False),
        (("--config",), "config", "value", None),
    ],
    "diff": [
        (("--rtol",), "rtol", "float", None),
        (("--json",), "json", "value", None),
        (("--report",), "report", "value", None),
        (("--quiet", "-q"), "quiet", "flag", False),
        (("--fail-on",), "fail_on", "value", "outputs"),
    ],  # v1.4
}
CASES = [(cmd, *row) for cmd, rows in V12.items() for row in rows]


def parsed(monkeypatch, command: str, *args: str):
    """The namespace ``command``'s ``run`` receives for ``nanhunter COMMAND POSITIONALS ARGS``."""
    seen = []
    monkeypatch.setattr(COMMANDS[command], "run", lambda a: seen.append(a) or 0)
    assert main([command, *POSITIONALS[command], *args]) == 0
    return seen[0]


@pytest.mark.parametrize(
    "command, flags, dest, kind, default", CASES, ids=[f"{c}{f[0]}" for c, f, *_ in CASES]
)
def test_every_v12_flag_parses_as_it_did(monkeypatch, command, flags, dest, kind, default):
    assert getattr(parsed(monkeypatch, command), dest) == default
    if kind == "flag":
        for f in flags:
            assert getattr(parsed(monkeypatch, command, f), dest) is (
                not f.startswith("--no-") or dest == "no_replay"
            )
    elif kind == "repeat":
        assert getattr(parsed(monkeypatch, command, flags[0], "x", flags[0], "y"), dest) == ["x", "y"]
    else:
        value = {"value": ("v", "v"), "float": ("1e-3", 1e-3), "int": ("3", 3)}[kind]
        assert getattr(parsed(monkeypatch, command, flags[0], value[0]), dest) == value[1]
        assert getattr(parsed(monkeypatch, command, f"{flags[0]}={value[0]}"), dest) == value[1]


@pytest.mark.parametrize("command", COMMANDS)
def test_no_flag_was_added_or_lost(command):
    group = build_command()
    ctx = group.make_context("nanhunter", [command, "--help"], resilient_parsing=True)
    cmd = group.get_command(ctx, command)
    opts = {o for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
    assert opts == {f for flags, *_ in V12[command] for f in flags}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_a_metavar_and_a_panel(command):
    group = build_command()
    ctx = group.make_context("nanhunter", [command, "--help"], resilient_parsing=True)
    cmd = group.get_command(ctx, command)
    for p in cmd.params:
        assert p.help, p.opts
        if p.param_type_name == "option":
            assert getattr(p, "rich_help_panel", None), p.opts
            if not p.is_flag:  # takes a value: the metavar says what, not a type name
                assert p.metavar and p.metavar != p.name.upper(), p.opts


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_panels_defaults_and_examples(command):
    code, out, err = invoke(command, "--help")
    text = " ".join(out.split())
    assert code == 0 and err == "" and f"Usage: nanhunter {command}" in text
    assert "Examples" in text and f"nanhunter {command} " in text.split("Examples", 1)[1]
    if command != "diff":
        for panel in ("Model", "Inputs", "Precision and device", "What to run", "Output"):
            assert f"─ {panel}" in out, panel


def test_scan_help_states_the_defaults():
    text = " ".join(invoke("scan", "--help").stdout.replace("│", " ").split())
    assert "(default: 0.01)" in text and "(default: inductor)" in text and "(default: fast)" in text


def test_bisect_help_names_keep_dtype_plainly():
    text = " ".join(invoke("bisect", "--help").stdout.replace("│", " ").split())
    assert "the precision kept modules run in (default: fp32)" in text
    assert "candidates: leaf modules, or whole transformer blocks" in text
    assert "---" not in text.replace("────", "")  # once read "the all---keep-dtype run"


@pytest.mark.parametrize(
    "typed, meant",
    [
        ("--dtpye", "--dtype"),
        ("--promt", "--prompt"),
        ("--compile-bakend", "--compile-backend"),
        ("--html", "--report"),
        ("--precision", "--dtype"),
        ("--junit-xml", "--junit"),
    ],
)
def test_did_you_mean(typed, meant):
    command = "check" if meant == "--junit" else "scan"
    code, out, err = invoke(command, "x.safetensors", typed, "fp16")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"unrecognized arguments: {typed}; did you mean {meant}? (see `nanhunter {command} --help`)" in err


def test_no_suggestion_for_nonsense_or_an_option_the_command_lacks():
    names = ["--dtype", "--rtol", "--json"]
    assert closest("--zzzzzzzz", names) is None
    assert closest("--html", names) is None  # bisect has no --report: no unrelated guess either


def test_unknown_command_suggests_the_close_one():
    code, _, err = invoke("sacn", "x")
    assert code == 2 and "invalid choice: 'sacn'" in err and "did you mean scan?" in err


def test_completion_of_a_flag(monkeypatch):
    code, out, _ = invoke(
        env={"_NANHUNTER_COMPLETE": "complete_bash", "COMP_WORDS": "nanhunter scan x --dt", "COMP_CWORD": "3"}
    )
    assert code == 0 and out.split() == ["--dtype"]
    # --show-completion takes no value: typer asks shellingham which shell runs it (the process tree),
    # which a test process started outside a shell does not have; run from bash, it says bash's script
    import typer.completion

    monkeypatch.setattr(typer.completion, "_get_shell_name", lambda: "bash")
    code, out, err = invoke("--show-completion")
    assert code == 0 and "_NANHUNTER_COMPLETE=complete_bash" in out, err
