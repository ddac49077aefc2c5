"""``nanhunter check``: the CI smoke check (registered on the main app), and the output helper
``scan`` shares with it (terminal view with the headroom strip, ``--report`` files)."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from ..errors import BadInput
from .main import (
    ArchOpt,
    AttnOpt,
    DataOpt,
    DeviceOpt,
    InputsOpt,
    PromptOpt,
    _emit,
    _fail,
    _progress,
    app,
)

ReportOpt = Annotated[str | None, typer.Option(
    "--report", help="also write a report: PATH.html (self-contained page) or PATH.md (Markdown + PATH.png)")]
StripOpt = Annotated[bool | None, typer.Option(
    "--strip/--no-strip", help="per-module headroom strip in the terminal (default: on for failing runs)")]


def _say(msg: str) -> None:
    sys.stderr.write(f"nanhunter: {msg}\n")


def write_report_file(reps, path: str | None) -> None:
    """``--report``: HTML or Markdown by suffix; a missing matplotlib costs the plot and one line."""
    if not path:
        return
    from ..render.html import write_report

    for note in write_report(reps, path):
        _say(note)


def emit_scan(rep, json_path: str | None, quiet: bool, strip: bool | None, report: str | None) -> int:
    """``_emit`` (JSON, exit code) with the terminal view drawn here so it can carry the strip."""
    code = _emit(rep, json_path, quiet=True)
    if not quiet:
        from rich.console import Console

        from ..render.terminal import render

        render(rep, Console(stderr=json_path == "-"), strip=code != 0 if strip is None else strip)
    write_report_file(rep, report)
    return code


def _check_out(path: str | None, flag: str) -> None:
    from pathlib import Path

    if path is None or path == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise BadInput(f"{flag} {path}: is a directory; give a file path such as {p / 'nanhunter.xml'}")
    if not p.parent.exists():
        raise BadInput(f"{flag} {path}: directory {p.parent} does not exist; create it or pick another path")


@app.command()
def check(
    checkpoints: Annotated[list[str], typer.Argument(
        help="checkpoints to check (files or model directories), e.g. the changed files a pre-commit hook passes")],
    arch: ArchOpt = None,
    inputs: InputsOpt = None,
    prompt: PromptOpt = None,
    data: DataOpt = None,
    dtypes: Annotated[str | None, typer.Option(
        "--dtypes", help="comma-separated precisions to check, e.g. fp16,bf16 (default: dtypes: in configs/ci.yaml)")] = None,
    device: DeviceOpt = "auto",
    json: Annotated[str | None, typer.Option(
        "--json", help="write the report v1 here ('-' for stdout); several checkpoints: a JSON array of reports")] = None,
    junit: Annotated[str | None, typer.Option(
        "--junit", help="write JUnit XML here: a testsuite per checkpoint, a testcase per rule")] = None,
    config: Annotated[str | None, typer.Option(
        "--config", help="YAML policy merged over configs/ci.yaml (thresholds, dtypes, fail_on_*)")] = None,
    attn: AttnOpt = None,
    report: ReportOpt = None,
    strip: StripOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no terminal report")] = False,
) -> None:
    """CI smoke check: weights scan plus one forward per dtype, judged by the policy in configs/ci.yaml.

    Exit 0: every rule passed (warnings allowed); 1: a rule failed; 2: bad input. With
    GITHUB_ACTIONS=true, failing and warning rules are also printed as ::error/::warning annotations.
    """
    try:
        from ..render.html import check_target
        from ..report import check_json_target

        check_json_target(json)
        _check_out(junit, "--junit")
        check_target(report)
        from ..check import check as run_check
        from ..check import passed, write_json_reports

        prog, cb = _progress()
        try:
            reps = run_check(checkpoints, dtypes=dtypes, config=config, progress=cb, arch=arch, inputs=inputs,
                             prompts=prompt, data=data, device=device, attn=attn)
        finally:
            if prog is not None:
                prog.close()
        from ..render.ci import annotations, render_check, write_junit

        if json:
            write_json_reports(reps, json)
        if junit:
            write_junit(reps, junit)
        to_stderr = json == "-"  # stdout holds the JSON then
        if not quiet:
            from rich.console import Console

            render_check(reps, Console(stderr=to_stderr), strip=strip)
        if os.environ.get("GITHUB_ACTIONS") == "true":
            out = sys.stderr if to_stderr else sys.stdout
            for line in annotations(reps):
                out.write(line + "\n")
            out.flush()
        write_report_file(reps, report)
        code = 0 if passed(reps) else 1
    except BadInput as e:
        _fail(str(e))
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    raise typer.Exit(code)
