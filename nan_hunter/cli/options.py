"""The flags commands share (loading, inputs, device, outputs), declared once for typer.

Each shared flag is an ``Annotated`` type: a command lists it as a parameter (``arch: Arch =
None``) and gets the same name, metavar, help and help panel as every other command. Values are
parsed as strings and converted here (``number``), so that a bad number says what argparse said
(``argument --rtol: invalid float value: 'abc'``) and parsing imports no validation library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from ..outputs import Output
from .output import collect_written

DTYPES_HELP = "fp32|bf16|fp16|fp8-e4m3|fp8-e5m2"

#: help panels, in the order they appear in ``--help``
MODEL = "Model: how it is built"
INPUTS = "Inputs: one per file, prompt or line"
RUN = "Precision and device"
MODE = "What to run"
OUTPUT = "Output"
PANELS = (MODEL, INPUTS, RUN, MODE, OUTPUT)


def _help(text: str, default: Any = None) -> str:
    """Help text as shown: the default appended unless the text states it (as argparse's formatter
    did), square brackets escaped (typer reads help as rich markup)."""
    if default not in (None, False, True) and "default" not in text:
        text = f"{text} (default: {default})"
    return text.replace("[", "\\[")


def opt(*names: str, help: str, metavar: str | None = None, panel: str | None = None, default: Any = None,
        callback: Callable[..., Any] | None = None) -> Any:
    """A ``typer.Option`` the project's way: explicit flag names (no ``--no-`` twin unless named),
    a metavar that says what the value is, the default stated in the help, a help panel."""
    return typer.Option(*names, help=_help(help, default), metavar=metavar, rich_help_panel=panel,
                        show_default=False, callback=callback)


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
CHECKPOINT_HELP = "a .safetensors file, a *.safetensors.index.json, or a model directory"
Checkpoint = Annotated[str, typer.Argument(metavar="CHECKPOINT", help=CHECKPOINT_HELP, show_default=False)]

# --- model and inputs (every command but diff) ------------------------------------------------------
Arch = Annotated[str | None, opt(
    "--arch", metavar="FILE.py:FACTORY", panel=MODEL,
    help="the model: path/to/file.py:factory or package.module:factory; factory() returns the nn.Module "
         "the weights load into (default: config.json of a model directory)")]
Attn = Annotated[str | None, opt(
    "--attn", metavar="eager|sdpa", panel=MODEL, help="transformers attn_implementation (default: the model's own)")]
Inputs = Annotated[list[str] | None, opt(
    "--inputs", metavar="FILE", panel=INPUTS, help="a .safetensors of forward() kwargs (repeatable)")]
Prompt = Annotated[list[str] | None, opt(
    "--prompt", metavar="TEXT", panel=INPUTS, help="text to tokenize (repeatable)")]
Data = Annotated[str | None, opt(
    "--data", metavar="FILE.jsonl", panel=INPUTS, help='a .jsonl file with {"text": ...} per line')]
Device = Annotated[str, opt(
    "--device", metavar="auto|cpu|cuda", panel=RUN, default="auto",
    help="where the model runs (auto: cuda when available)")]
DeviceMap = Annotated[str | None, opt(
    "--device-map", metavar="auto", panel=RUN,
    help="place a model bigger than one device with accelerate (GPUs, then CPU memory, then disk offload); "
         "overrides --device")]
MaxMemory = Annotated[list[str] | None, opt(
    "--max-memory", metavar="DEV=SIZE", panel=RUN,
    help="--device-map: memory cap per device, e.g. cpu=200MB or cuda:0=10GiB (repeatable)")]

# --- what to run ------------------------------------------------------------------------------------
Generate = Annotated[str | None, opt(
    "--generate", metavar="N", panel=MODE, callback=number(int, "--generate"),
    help="greedy decoding of up to N new tokens per input through the model's generate(), every step "
         "captured; stops at the first non-finite value")]
Batch = Annotated[bool, flag(
    "--batch", panel=MODE, help="--generate: decode all inputs together as one left-padded batch")]
Backward = Annotated[bool, flag(
    "--backward", panel=MODE, help="forward then backward of a loss for each input; the backward is captured too")]
Loss = Annotated[str | None, opt(
    "--loss", metavar="FILE.py:FN", panel=MODE,
    help="--backward: fn(outputs, batch) -> scalar tensor (default: a causal LM's own loss, labels = input_ids)")]

# --- output ---------------------------------------------------------------------------------------
JSON_HELP = "write the JSON report here ('-' for stdout)"
Json = Annotated[str | None, opt("--json", metavar="PATH", panel=OUTPUT, help=JSON_HELP)]
Report = Annotated[str | None, opt(
    "--report", metavar="PATH", panel=OUTPUT,
    help="also write a report: PATH.html (self-contained page) or PATH.md (Markdown + PATH.png)")]
Strip = Annotated[bool | None, flag(
    "--strip/--no-strip", panel=OUTPUT, help="per-module headroom strip in the terminal (default: on for failing runs)")]
Quiet = Annotated[bool, flag("--quiet", "-q", panel=OUTPUT, help="no terminal report and no progress on stderr")]
Config = Annotated[str | None, opt(
    "--config", metavar="FILE", panel=OUTPUT, help="YAML merged over configs/default.yaml")]
Trace = Annotated[str | None, opt(
    "--trace", metavar="PATH", panel=OUTPUT,
    help="write a numerics trace of the run (nanhunter.trace/v1, JSON lines; .gz: gzip) for `nanhunter diff`")]
TraceLevel = Annotated[str, opt(
    "--trace-level", metavar="modules|ops", panel=OUTPUT, default="modules",
    help="--trace: one entry per module call, or per aten op (with producer links)")]
Repeat = Annotated[str | None, opt(
    "--repeat", metavar="N", panel=OUTPUT, callback=number(int, "--repeat"),
    help="--trace: run each input N times (N >= 2) and store each entry's run-to-run spread")]


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
