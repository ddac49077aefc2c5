"""Bad usage in one line: click's usage errors (the parser under typer) said as nanhunter has
always said them (v1–v1.2 wording: ``unrecognized arguments: --bogus``, ``the following arguments
are required: checkpoint``, ``argument --rtol: invalid float value: 'abc'``), with a suggestion
for a mistyped option or command and where to read more:

    nanhunter: error: unrecognized arguments: --dtpye; did you mean --dtype? (see `nanhunter scan --help`)
"""

from __future__ import annotations

import re
from typing import Any

#: how argparse named the positional arguments in its messages (its ``dest``, or the metavar of a
#: list): kept so that a missing argument reads as it always has
ARGUMENT_NAMES = {"checkpoint": "checkpoint", "checkpoints": "CHECKPOINT", "a": "A", "b": "B"}


def click_exceptions() -> Any:
    """click's exception classes as typer raises them: its own copy of click (typer ≥ 0.2x
    vendors it as ``typer._click``) or the click package (older typer)."""
    import importlib

    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:  # typer that depends on click instead of vendoring it
        return importlib.import_module("click.exceptions")


def usage_line(e: Any, argv: list[str]) -> str:
    """The one line for click usage error ``e`` raised while parsing ``argv``."""
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None and ctx.command_path else _command_path(argv)
    return f"nanhunter: error: {describe(e, argv)} (see `{where} --help`)"


def _command_path(argv: list[str]) -> str:
    """``nanhunter scan`` when ``argv`` names a command (an error raised without a context)."""
    from .app import COMMANDS  # lazy: typer, after parsing

    typed = next((a for a in argv if not a.startswith("-")), None)
    return f"nanhunter {typed}" if typed in COMMANDS else "nanhunter"


def describe(e: Any, argv: list[str]) -> str:
    kind = type(e).__name__
    message = str(getattr(e, "message", "") or e)
    param = getattr(e, "param", None)
    ctx = getattr(e, "ctx", None)
    if kind == "NoSuchOption":
        flag = e.option_name
        return f"unrecognized arguments: {flag}{_hint(flag, _option_names(ctx))}"
    if kind == "MissingParameter" and param is not None and param.param_type_name == "argument":
        return "the following arguments are required: " + ", ".join(_missing_arguments(ctx, param))
    if kind == "BadParameter" and param is not None:
        return f"argument {_flag(param)}: {message}"
    if kind == "BadOptionUsage":
        flag = getattr(e, "option_name", None) or ""
        if "requires an argument" in message:
            return f"argument {flag}: expected one argument"
        if "does not take a value" in message:
            given = next((a.split("=", 1)[1] for a in argv if a.startswith(f"{flag}=")), "")
            return f"argument {flag}: ignored explicit argument {given!r}"
    m = re.match(r"Got unexpected extra argument(?:s|\(s\))? \((.*)\)$", message)
    if m:
        return f"unrecognized arguments: {m.group(1)}"
    if message.startswith("No such command"):
        return _unknown_command(ctx, argv)
    return message[:1].lower() + message[1:]


def _flag(param: Any) -> str:
    """How argparse named an option in its messages: its flags joined by "/" (``--quiet/-q``)."""
    names = [n for n in getattr(param, "opts", []) if n.startswith("-")]
    return "/".join(names) or param.name


def _option_names(ctx: Any) -> list[str]:
    if ctx is None:
        return []
    return sorted(
        {
            n
            for p in ctx.command.params
            for n in (*p.opts, *getattr(p, "secondary_opts", ()))
            if n.startswith("--")
        }
        | {"--help"}
    )


def _hint(flag: str, names: list[str]) -> str:
    """ "; did you mean --dtype?" for ``--dtpye`` or ``--precision`` (``pipeline.options.closest``)."""
    from ..pipeline.options import closest  # lazy: --help stays light

    meant = closest(flag.split("=", 1)[0], names)
    return f"; did you mean {meant}?" if meant else ""


def _missing_arguments(ctx: Any, param: Any) -> list[str]:
    """The missing argument and every required one after it (arguments fill in order)."""
    args = [p for p in ctx.command.params if p.param_type_name == "argument"] if ctx is not None else [param]
    after = args[args.index(param) :] if param in args else [param]
    return [ARGUMENT_NAMES.get(p.name, p.name) for p in after if p.required]


def _unknown_command(ctx: Any, argv: list[str]) -> str:
    import difflib

    commands = list(getattr(ctx.command, "commands", {})) if ctx is not None else []
    typed = next((a for a in argv if not a.startswith("-")), "")
    choices = ", ".join(repr(c) for c in commands)
    close = difflib.get_close_matches(typed, commands, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"argument COMMAND: invalid choice: {typed!r} (choose from {choices}){hint}"
