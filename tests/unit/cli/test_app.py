"""cli/app.py: the typer application — four commands, ``-h``/``--help``, ``--version`` (eager,
exits 0), examples printed under each command's help, and values taken as click parsed them."""

from __future__ import annotations

import io
import sys

import pytest
import typer

from nan_hunter.cli import app


def _context(*args: str):
    return app.build_command().make_context(app.PROG, list(args), resilient_parsing=True)


def test_the_commands():
    group = app.build_command()
    assert list(group.commands) == list(app.COMMANDS) == ["scan", "bisect", "check", "diff"]
    assert group.help == app.DESCRIPTION
    assert all(
        group.commands[c].context_settings["help_option_names"] == ["-h", "--help"] for c in app.COMMANDS
    )


@pytest.mark.parametrize("command", app.COMMANDS)
def test_each_command_shows_its_examples_under_its_help(monkeypatch, command):
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    monkeypatch.setenv("COLUMNS", "200")
    group = app.build_command()
    with pytest.raises(typer.Exit):
        group.commands[command].make_context(command, ["--help"])
    out = buf.getvalue()
    cls = type(group.commands[command])
    assert issubclass(cls, app.ExamplesCommand) and cls.examples
    assert "Examples" in out and cls.examples[0][0] in out


def test_version_is_eager_and_exits_0(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    with pytest.raises(typer.Exit) as e:
        app.build_command().make_context(app.PROG, ["--version", "scan"])
    assert e.value.exit_code == 0 and buf.getvalue().startswith("nanhunter ")


def test_version_callback_does_nothing_when_not_asked():
    assert app._version(False) is None


@pytest.mark.parametrize(
    "args, name, value",
    [
        (["scan", "x.safetensors", "--quiet"], "quiet", True),
        (["scan", "x.safetensors"], "quiet", False),  # a flag not given: its default, a bool
        (
            ["scan", "x.safetensors"],
            "strip",
            None,
        ),  # --strip/--no-strip not given: None (the command decides)
        (["scan", "x.safetensors", "--no-strip"], "strip", False),
        (["scan", "x.safetensors", "--rtol", "1e-3"], "rtol", 1e-3),  # a number: converted by options.number
        (["scan", "x.safetensors", "--prompt", "a", "--prompt", "b"], "prompt", ["a", "b"]),
    ],
)
def test_values_as_parsed(args, name, value):
    group = app.build_command()
    ctx = _context(*args)
    sub = group.get_command(ctx, args[0])
    sub_ctx = sub.make_context(args[0], args[1:], parent=ctx)
    assert sub_ctx.params[name] == value
