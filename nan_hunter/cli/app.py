"""The typer application: the root (``--version``, ``--help``, shell completion) and one command
per module (``scan_cmd``, ``bisect_cmd``, ``check_cmd``, ``diff_cmd``), each with its examples
printed under its help."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from . import bisect_cmd, check_cmd, diff_cmd, scan_cmd

DESCRIPTION = "Find the first module and aten op that produced NaN/Inf, and how to fix it."
PROG = "nanhunter"
#: the environment variable shell completion runs the command with (``_NANHUNTER_COMPLETE=bash_source``)
COMPLETE_VAR = "_NANHUNTER_COMPLETE"
CONTEXT = {"help_option_names": ["-h", "--help"]}
COMMANDS = ("scan", "bisect", "check", "diff")


class _AsParsed:
    """typer ≥ 0.27 passes every value through a pydantic ``TypeAdapter`` (importing pydantic costs
    0.1-0.2 s, before ``--help`` is shown). Every parameter here is a string, a list of strings or
    a flag, which click's parser already gives as such: they are taken as parsed (numbers are
    converted by ``options.number``)."""

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None and getattr(param, "is_flag", False) and param.default is not None:
            return bool(param.default)  # a flag not given (--help); --strip/--no-strip keeps None
        return value


_AS_PARSED = _AsParsed()


def _prepared(p: Any) -> Any:
    """A parameter as this CLI uses it: no type shown beside a flag (``--quiet``) or an argument
    (its metavar says what it is) in the help, where typer ≥ 0.27 would add ``<bool>`` or
    ``<str>``; its value taken as click parsed it (``_AsParsed``)."""
    if p is None:
        return p
    if (p.param_type_name == "argument" or getattr(p, "is_flag", False)) and hasattr(p, "display_type_rich"):
        p.display_type_rich = lambda ctx: None
    if getattr(p, "_runtime_param", False) is None:
        p._runtime_param = _AS_PARSED
    return p


class RootGroup(TyperGroup):
    """``nanhunter`` itself: its commands and ``--version``."""

    def get_params(self, ctx: Any) -> list:
        return [_prepared(p) for p in super().get_params(ctx)]


class ExamplesCommand(TyperCommand):
    """A command whose ``--help`` ends with its examples (commands as typed, never re-wrapped)."""

    examples: list[tuple[str, str]] = []

    def get_params(self, ctx: Any) -> list:
        return [_prepared(p) for p in super().get_params(ctx)]

    def format_help(self, ctx: Any, formatter: Any) -> Any:
        out = super().format_help(ctx, formatter)
        if self.examples:
            from ..render.help import print_examples  # lazy: rich, after parsing

            print_examples(self.examples)
        return out


def _with_examples(name: str, examples: list[tuple[str, str]]) -> type:
    return type(f"{name.capitalize()}Command", (ExamplesCommand,), {"examples": examples})


def _version(value: bool) -> None:
    if value:
        from .about import version_lines  # lazy: --help stays light

        typer.echo("\n".join(version_lines()))
        raise typer.Exit(0)


def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_version,
            help="print the versions a bug report needs (nanhunter, Python, torch and its device, "
            "transformers, ...) and exit",
        ),
    ] = False,
) -> None:
    """Find the first module and aten op that produced NaN/Inf, and how to fix it."""


def build_app() -> typer.Typer:
    app = typer.Typer(
        name=PROG,
        help=DESCRIPTION,
        add_completion=True,
        rich_markup_mode="rich",
        cls=RootGroup,
        context_settings=CONTEXT,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    for mod, name, short, long in (
        (scan_cmd, "scan", scan_cmd.HELP, scan_cmd.HELP),
        (bisect_cmd, "bisect", bisect_cmd.HELP, bisect_cmd.HELP),
        (check_cmd, "check", check_cmd.HELP, check_cmd.DESCRIPTION),
        (diff_cmd, "diff", diff_cmd.HELP, diff_cmd.DESCRIPTION),
    ):
        app.command(
            name,
            help=long.replace("[", "\\["),
            short_help=short,
            cls=_with_examples(name, mod.EXAMPLES),
            context_settings=CONTEXT,
        )(mod.command)
    return app


def build_command() -> Any:
    """The click command typer builds from the application (what ``main`` runs)."""
    return typer.main.get_command(build_app())
