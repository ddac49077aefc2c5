"""nan_hunter/options.py: each option defined once. An option is one field of an option group that
carries its flag; this file holds everything else against the fields, both ways: the typer command's
flags (generated, with help, metavar and panel), the Python API's keywords with the same defaults
and a docstring line each, and a mention in docs/ — so a field without them, or a keyword, flag or
doc line without a field, fails here, naming it."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

import nan_hunter
from nan_hunter.bisection.options import BisectOptions
from nan_hunter.cli.app import build_command
from nan_hunter.errors import BadInput
from nan_hunter.options import (
    CompileBackend,
    Granularity,
    KeepDtype,
    Over,
    Panel,
    TraceLevel,
    choice,
    choices,
    option,
    option_fields,
    values_from_cli,
)
from nan_hunter.pipeline.options import CheckOptions, ScanOptions

ROOT = Path(__file__).resolve().parents[2]
#: (command, its options class, its API function or None, the API keywords that are no option)
COMMANDS = [
    ("scan", ScanOptions, nan_hunter.scan, {"checkpoint", "config", "progress"}),
    ("bisect", BisectOptions, nan_hunter.bisect, {"checkpoint", "config", "progress"}),
    ("check", CheckOptions, nan_hunter.check, {"checkpoints", "config", "progress"}),
]
#: flags only the command line has (outputs, the configuration file): no option field
CLI_ONLY = {
    "--json",
    "--report",
    "--strip",
    "--no-strip",
    "--quiet",
    "-q",
    "--config",
    "--junit",
    "--help",
    "-h",
}


def _cli_flags(command: str) -> set[str]:
    group = build_command()
    ctx = group.make_context("nanhunter", [command, "--help"], resilient_parsing=True)
    cmd = group.get_command(ctx, command)
    return {o for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("command, cls", [(c, k) for c, k, *_ in COMMANDS])
def test_every_field_is_a_flag_and_every_flag_a_field(command, cls):
    flags = {n for _, fl in option_fields(cls) for n in fl.names}
    assert _cli_flags(command) - CLI_ONLY == flags


@pytest.mark.parametrize("command, cls, fn, extra", [c for c in COMMANDS if c[2] is not None])
def test_the_api_keywords_are_the_fields_with_their_defaults_and_docs(command, cls, fn, extra):
    params = inspect.signature(fn).parameters
    names = {f.name for f, _ in option_fields(cls)}
    assert set(params) - extra == names, (
        "API keywords without a field",
        set(params) - extra - names,
        "fields without an API keyword",
        names - set(params),
    )
    for f, fl in option_fields(cls):
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY, f.name
        same = (None, ()) if fl.repeatable else (f.default,)  # a repeatable keyword not given: None is ()
        assert params[f.name].default in same, (f.name, params[f.name].default, f.default)
    doc = inspect.getdoc(fn)
    documented = {
        n
        for group in re.findall(r"^ {4}([a-z_]+(?:, [a-z_]+)*):", doc, flags=re.M)
        for n in group.split(", ")
    }
    assert names <= documented, f"{fn.__name__}'s docstring has no line for {sorted(names - documented)}"


@pytest.mark.parametrize("command, cls", [(c, k) for c, k, *_ in COMMANDS])
def test_every_flag_is_documented(command, cls):
    pages = (ROOT / "docs" / "cli.md").read_text() + (ROOT / "docs" / "ci.md").read_text()
    missing = [
        n
        for _, fl in option_fields(cls)
        for n in fl.names
        if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", pages)
    ]
    assert not missing, f"flags of {command} not in docs/cli.md or docs/ci.md: {missing}"


def test_help_order_is_by_panel_then_field():
    panels = [fl.panel for _, fl in option_fields(ScanOptions)]
    assert panels == sorted(panels, key=list(Panel).index)
    assert [f.name for f, _ in option_fields(ScanOptions)][:3] == ["arch", "attn", "inputs"]


@pytest.mark.parametrize(
    "enum, values",
    [
        (TraceLevel, "modules|ops"),
        (CompileBackend, "inductor|aot_eager|eager"),
        (Granularity, "leaf|block"),
        (Over, "modules|inputs"),
        (KeepDtype, "fp32|bf16"),
    ],
)
def test_choices_are_the_strings_users_type(enum, values):
    assert choices(enum) == values
    for v in values.split("|"):
        assert enum(v) == v and choice(enum, v, "no") == v and type(choice(enum, v, "no")) is str


def test_a_bad_choice_exits_2_with_its_line():
    assert choice(Over, None, "no") is None
    with pytest.raises(BadInput, match=r"^--over x: use modules or inputs$"):
        choice(Over, "x", "--over x: use modules or inputs")


def test_values_from_cli_keeps_defaults_and_turns_flags_into_fields():
    class Args:
        prompt = ["a", "b"]
        no_replay = True
        compile = False  # a flag not given: the field's default
        rtol = None  # a value not given: the field's default
        dtype = "fp16"

    got = values_from_cli(ScanOptions, Args())
    assert got == {"prompts": ("a", "b"), "replay": False, "dtype": "fp16"}


def test_an_option_default_is_immutable():
    with pytest.raises(TypeError, match="immutable"):
        option([], "--x", help="h", panel=Panel.MODE)
    assert all(not isinstance(f.default, list) for f in fields(ScanOptions))
