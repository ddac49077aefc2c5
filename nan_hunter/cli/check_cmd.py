"""``nanhunter check``: the CI smoke check (weights scan plus one forward per dtype, judged by
configs/ci.yaml), with JUnit XML, JSON, GitHub annotations and ``--report`` files."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from ..options import values_from_cli
from ..outputs import STDOUT, write_text
from ..pipeline.options import CheckOptions
from . import options as o
from .output import (
    check_command_outputs,
    planned_outputs,
    scan_progress,
    terminal_limits,
    write_report_file,
)

HELP = "CI smoke check: weights scan plus one forward per dtype, judged by the policy in configs/ci.yaml."
DESCRIPTION = HELP + (
    " Exit 0: every rule passed (warnings allowed); 1: a rule failed; 2: bad input. With "
    "GITHUB_ACTIONS=true, failing and warning rules are also printed as ::error/::warning "
    "annotations."
)


EXAMPLES = o.examples(
    (
        "a pre-commit or CI check of changed checkpoints, JUnit for the CI",
        "nanhunter check model.safetensors --arch model.py:build --inputs batch.safetensors --junit junit.xml",
    ),
    (
        "fp16 and bf16 forwards of a model directory on a prompt",
        "nanhunter check ./my-model --prompt 'Hello' --dtypes fp16,bf16",
    ),
)


def run(args: Any) -> int:
    outs = planned_outputs(args, [("json", "--json"), ("junit", "--junit")], n_reports=len(args.checkpoints))
    # the baseline is read too: no output may overwrite it
    stdout_taken = check_command_outputs(
        outs, args, args.checkpoints + ([args.baseline] if args.baseline else [])
    )
    from ..config import load_config  # lazy: --help stays light

    cfg = load_config(args.config)  # validated before any work: a bad file exits 2 at once
    from ..distributed.ranks import finish, process_group, writes  # lazy: --help stays light
    from ..pipeline.ci_check import check, passed  # lazy: numpy, after parsing

    with process_group(args.device) as split:  # under torchrun: the data set split across ranks
        prog, cb = scan_progress() if writes() else (None, None)
        try:
            reps = check(
                args.checkpoints, config=cfg, progress=cb, split=split, **values_from_cli(CheckOptions, args)
            )
        finally:
            if prog is not None:
                prog.close()
        code = 0 if passed(reps) else 1
        if writes():  # rank 0 (or the one process) prints and writes
            _outputs(reps, args, cfg, stdout_taken)
        return finish(code)


def _outputs(reps: list, args: Any, cfg: object, stdout_taken: bool) -> None:
    from ..pipeline.ci_check import write_json_reports  # lazy: numpy, after parsing
    from ..render.ci import annotations as github_annotations  # lazy: --help stays light
    from ..render.ci import write_junit  # lazy: --help stays light

    for rep in reps:
        rep.add_context(command=getattr(args, "argv", None))
    if args.json is not None:
        write_json_reports(reps, args.json)
    if args.junit is not None:
        write_junit(reps, args.junit)
    if not args.quiet:
        from ..render.terminal import render_check  # lazy: rich, after parsing

        render_check(reps, strip=args.strip, stderr=stdout_taken, **terminal_limits(cfg))
    if os.environ.get("GITHUB_ACTIONS") == "true":
        text = "".join(line + "\n" for line in github_annotations(reps))
        if stdout_taken:
            sys.stderr.write(text)
            sys.stderr.flush()
        else:  # a reader of stdout that went away drops them, as it drops the terminal view
            write_text("GitHub annotations", STDOUT, text)
    write_report_file(reps, args.report, args.quiet)


#: the typer command: ``CHECKPOINT...``, one flag per ``CheckOptions`` field, then the outputs
command = o.command(
    CheckOptions,
    lambda args: run(args),  # run looked up when called: tests replace it
    [
        (
            "checkpoints",
            Annotated[
                list[str],
                typer.Argument(
                    metavar="CHECKPOINT",
                    show_default=False,
                    help="checkpoints to check (files or model directories), e.g. the changed files a pre-commit hook passes",
                ),
            ],
        )
    ],
    [
        (
            "json",
            Annotated[
                str | None,
                o.opt(
                    "--json",
                    metavar="PATH",
                    panel=o.OUTPUT,
                    help="write the report v1 here ('-' for stdout); several checkpoints: a JSON array of reports",
                ),
            ],
            None,
        ),
        (
            "junit",
            Annotated[
                str | None,
                o.opt(
                    "--junit",
                    metavar="PATH",
                    panel=o.OUTPUT,
                    help="write JUnit XML here ('-' for stdout): a testsuite per checkpoint, a testcase per rule",
                ),
            ],
            None,
        ),
        ("report", o.Report, None),
        ("strip", o.Strip, None),
        ("quiet", o.Quiet, False),
        (
            "config",
            Annotated[
                str | None,
                o.opt(
                    "--config",
                    metavar="FILE",
                    panel=o.OUTPUT,
                    help="YAML policy merged over configs/ci.yaml (thresholds, dtypes, fail_on_*)",
                ),
            ],
            None,
        ),
    ],
)
