"""The typer parameters, generated from the option groups (``nan_hunter/options.py``).

A command's options are the fields of its options class (``ScanOptions``, ``BisectOptions``,
``CheckOptions``): ``command`` turns each field's ``Flag`` into a typer parameter (name, metavar,
help, help panel), so a new option is one field. What only the command line has (its arguments,
``--json``, ``--report``, ``--quiet``, ``--config``) is an ``Annotated`` type here. Values are
parsed as strings and converted here (``number``), so that a bad number says what argparse said
(``argument --rtol: invalid float value: 'abc'``) and parsing imports no validation library.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ..options import Flag, Panel, option_fields
from ..outputs import Output
from .output import collect_written

#: help panels, in the order they appear in ``--help``
MODEL, INPUTS, RUN, MODE, OUTPUT = (p.value for p in Panel)
PANELS = (MODEL, INPUTS, RUN, MODE, OUTPUT)


def _help(text: str, default: Any = None) -> str:
    """Help text as shown: the default appended unless the text states it (as argparse's formatter
    did), square brackets escaped (typer reads help as rich markup)."""
    if default not in (None, False, True) and "default" not in text:
        text = f"{text} (default: {default})"
    return text.replace("[", "\\[")


def opt(
    *names: str,
    help: str,
    metavar: str | None = None,
    panel: str | None = None,
    default: Any = None,
    callback: Callable[..., Any] | None = None,
) -> Any:
    """A ``typer.Option`` the project's way: explicit flag names (no ``--no-`` twin unless named),
    a metavar that says what the value is, the default stated in the help, a help panel."""
    return typer.Option(
        *names,
        help=_help(help, default),
        metavar=metavar,
        rich_help_panel=panel,
        show_default=False,
        callback=callback,
    )


def flag(*names: str, help: str, panel: str | None = None) -> Any:
    """A flag (takes no value)."""
    return typer.Option(*names, help=_help(help), rich_help_panel=panel, show_default=False)


def number(kind: type, flag: str) -> Callable[..., Any]:
    """A callback converting a flag's string to ``kind`` (int or float), refusing like argparse:
    ``invalid float value: 'abc'``."""

    def convert(ctx: Any, param: Any, value: str | None) -> Any:
        if value is None or ctx.resilient_parsing:
            return value
        try:
            return kind(value)
        except ValueError:
            raise typer.BadParameter(f"invalid {kind.__name__} value: {value!r}") from None

    convert.__name__ = f"{kind.__name__}_{flag.strip('-').replace('-', '_')}"
    return convert


# --- arguments -----------------------------------------------------------------------------------
CHECKPOINT_HELP = (
    "a .safetensors, .gguf or .pt/.bin file, a *.safetensors.index.json, or a model or capsule directory"
)
Checkpoint = Annotated[str, typer.Argument(metavar="CHECKPOINT", help=CHECKPOINT_HELP, show_default=False)]

# --- output ---------------------------------------------------------------------------------------
JSON_HELP = "write the JSON report here ('-' for stdout)"
Json = Annotated[str | None, opt("--json", metavar="PATH", panel=OUTPUT, help=JSON_HELP)]
Report = Annotated[
    str | None,
    opt(
        "--report",
        metavar="PATH",
        panel=OUTPUT,
        help="also write a report: PATH.html (self-contained page) or PATH.md (Markdown + PATH.png)",
    ),
]
Strip = Annotated[
    bool | None,
    flag(
        "--strip/--no-strip",
        panel=OUTPUT,
        help="per-module headroom strip in the terminal (default: on for failing runs)",
    ),
]
Quiet = Annotated[
    bool, flag("--quiet", "-q", panel=OUTPUT, help="no terminal report and no progress on stderr")
]
Config = Annotated[
    str | None, opt("--config", metavar="FILE", panel=OUTPUT, help="YAML merged over configs/default.yaml")
]


def parameter_of(name: str, fl: Flag, default: Any) -> inspect.Parameter:
    """The typer parameter of one option field: a flag (no metavar) is a bool; a repeatable option a
    list of strings; a number a string converted by ``number``. Its CLI default is the field's (what
    ``run`` reads, e.g. ``args.device``); a repeatable option not given is None."""
    cli_default = None if fl.repeatable else default
    if fl.metavar is None:
        kind: Any
        info, kind = flag(*fl.names, help=fl.help, panel=fl.panel.value), bool
    else:
        info = opt(
            *fl.names,
            metavar=fl.metavar,
            panel=fl.panel.value,
            default=cli_default,
            help=fl.help,
            callback=number(fl.number, fl.names[0]) if fl.number is not None else None,
        )
        kind = list[str] | None if fl.repeatable else str | None
    if fl.inverted:
        cli_default = False
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=cli_default, annotation=Annotated[kind, info]
    )


def command(
    options: type,
    run: Callable[[Any], int],
    arguments: list[tuple[str, Any]],
    outputs: list[str | tuple[str, Any, Any]],
) -> Callable[..., int]:
    """A command's typer function, generated: its ``arguments`` (name, ``Annotated`` type), then one
    parameter per option field of ``options`` in help order (by panel, then field order), then its
    ``outputs`` panel in the order given — a name is an output field of ``options`` (``policy_out``),
    a (name, type, default) a command-line-only flag (``--json``); output fields not named come
    first. Calling it runs ``run`` on the parsed flags (``namespace``)."""
    params = [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=a) for n, a in arguments
    ]
    named = {x for x in outputs if isinstance(x, str)}
    by_name = {}
    for f, fl in option_fields(options):
        by_name[f.name] = parameter_of(fl.cli_name, fl, f.default)
        if f.name not in named:
            params.append(by_name[f.name])
    for x in outputs:
        if isinstance(x, str):
            params.append(by_name[x])
        else:
            name, ann, default = x
            params.append(
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)
            )

    signature = inspect.Signature(params, return_annotation=int)

    def cmd(*args: Any, **values: Any) -> int:
        bound = signature.bind(
            *args, **values
        )  # called from Python (tests): a flag not given takes its default
        bound.apply_defaults()
        return run(namespace(dict(bound.arguments)))

    cmd.__signature__ = signature  # type: ignore[attr-defined]
    cmd.__annotations__ = {p.name: p.annotation for p in params} | {"return": int}
    return cmd


def examples(*lines: tuple[str, str]) -> list[tuple[str, str]]:
    """A command's examples for its help: (what it does, the command line)."""
    return list(lines)


#: the command line as run (``run.command`` in the report), set by ``main``
COMMAND_LINE: list[str] | None = None
#: True once a command's own code runs (after parsing, ``--help`` and ``--version``)
STARTED = False


def namespace(values: dict[str, Any]) -> Any:
    """The parsed flags as attributes (``args.prompt``), a repeatable flag not given as None, and
    ``args.argv`` the command line — what the commands' ``run(args)`` read."""
    from types import SimpleNamespace

    global STARTED
    STARTED = True
    collect_written(bool(values.get("quiet")))
    args = {k: (list(v) or None if isinstance(v, (list, tuple)) else v) for k, v in values.items()}
    return SimpleNamespace(**args, argv=COMMAND_LINE)


def trace_output(args: Any) -> list:
    """``--trace PATH`` as an output (checked with the others before any work; never stdout)."""

    return [Output("--trace", args.trace, text=False)] if getattr(args, "trace", None) else []
