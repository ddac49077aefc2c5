"""``nanhunter`` commands. Heavy imports (torch, rich rendering) happen inside commands, so
``nanhunter --help`` and ``--version`` stay instant."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from .. import __version__
from ..errors import BadInput

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False,
                  help="Find the first module and aten op that produced NaN/Inf, and how to fix it.")

CheckpointArg = Annotated[str, typer.Argument(help="a .safetensors file, a *.safetensors.index.json, or a model directory")]
ArchOpt = Annotated[str | None, typer.Option("--arch", help="path/to/file.py:factory or package.module:factory")]
InputsOpt = Annotated[list[str] | None, typer.Option("--inputs", help="a .safetensors of forward() kwargs (repeatable)")]
PromptOpt = Annotated[list[str] | None, typer.Option("--prompt", help="text to tokenize (repeatable)")]
DataOpt = Annotated[str | None, typer.Option("--data", help='a .jsonl file with {"text": ...} per line')]
DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="fp32|bf16|fp16|fp8-e4m3|fp8-e5m2 (default: the checkpoint's)")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto|cpu|cuda")]
JsonOpt = Annotated[str | None, typer.Option("--json", help="write the JSON report here ('-' for stdout)")]
ConfigOpt = Annotated[str | None, typer.Option("--config", help="YAML merged over configs/default.yaml")]
AttnOpt = Annotated[str | None, typer.Option("--attn", help="transformers attn_implementation (eager|sdpa)")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nanhunter {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _fail(msg: str, code: int = 2) -> None:
    sys.stderr.write(f"nanhunter: error: {msg}\n")
    raise typer.Exit(code)


def _emit(rep, json_path: str | None, quiet: bool = False) -> int:
    from ..report import write_json

    if json_path:
        write_json(rep, json_path)
    if not quiet:
        from rich.console import Console

        from ..render.terminal import render

        # With --json -, the terminal view goes to stderr so stdout stays valid JSON.
        render(rep, Console(stderr=json_path == "-"))
    return rep.exit_code()


def _progress():
    """A rich progress callback for the weights scan, shown only on a terminal."""
    if not sys.stderr.isatty():
        return None, None
    from ..render.progress import ScanProgress

    p = ScanProgress()
    return p, p.update


@app.command()
def scan(
    checkpoint: CheckpointArg,
    arch: ArchOpt = None,
    inputs: InputsOpt = None,
    prompt: PromptOpt = None,
    data: DataOpt = None,
    dtype: DtypeOpt = None,
    device: DeviceOpt = "auto",
    json: JsonOpt = None,
    config: ConfigOpt = None,
    attn: AttnOpt = None,
    stats: Annotated[str, typer.Option("--stats", help="fast (sampled underflow) | full (exact, slower)")] = "fast",
    no_replay: Annotated[bool, typer.Option("--no-replay", help="skip the dtype replay")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no terminal report")] = False,
    report: Annotated[str | None, typer.Option("--report", help="also write PATH.html (self-contained) or PATH.md (+ PATH.png)")] = None,
    strip: Annotated[bool | None, typer.Option("--strip/--no-strip", help="per-module headroom strip (default: on when failing)")] = None,
) -> None:
    """Scan weights, run the model under hooks, locate the first NaN/Inf, replay and diagnose it."""
    try:
        from ..render.html import check_target
        from ..report import check_json_target

        check_json_target(json)
        check_target(report)
        from ..pipeline import scan as run_scan

        prog, cb = _progress()
        try:
            rep = run_scan(checkpoint, arch=arch, inputs=inputs, prompts=prompt, data=data, dtype=dtype,
                           device=device, stats=stats, config=config, attn=attn, progress=cb,
                           replay=not no_replay)
        finally:
            if prog is not None:
                prog.close()
        from .check_cmd import emit_scan

        code = emit_scan(rep, json, quiet, strip, report)  # _emit + the strip and --report files
    except BadInput as e:
        _fail(str(e))
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    raise typer.Exit(code)


from . import bisect_cmd, check_cmd  # noqa: E402,F401  (register their commands on app)


def run() -> None:
    """Console-script entry point: bad input → one line and exit 2; internal errors → exit 3."""
    try:
        app()
    except BadInput as e:
        sys.stderr.write(f"nanhunter: error: {e}\n")
        sys.exit(2)
    except Exception as e:  # never a traceback for the user; NANHUNTER_DEBUG=1 shows it
        if os.environ.get("NANHUNTER_DEBUG"):
            raise
        sys.stderr.write(f"nanhunter: internal error: {type(e).__name__}: {e} "
                         "(set NANHUNTER_DEBUG=1 for the traceback and report it)\n")
        sys.exit(3)


if __name__ == "__main__":  # pragma: no cover
    # Run the registered app of the real module, not this __main__ copy (commands live there).
    from nan_hunter.cli.main import run as _run

    _run()
