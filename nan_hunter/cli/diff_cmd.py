"""``nanhunter diff A B``: where two traces of the same model and inputs part."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..errors import BadInput
from ..outputs import Output, check_outputs, write_text
from . import options as o

HELP = "Compare two traces (scan --trace) and name the first op or module where the runs part."
DESCRIPTION = HELP + (
    " Exit 1 when the outputs differ beyond tolerance or one side is non-finite where the "
    "other is not (with --fail-on divergence: also for a divergence inside that did not reach "
    "the outputs); 0 otherwise; 2: the traces cannot be compared."
)

EXAMPLES = o.examples(
    (
        "a trace in each environment, then the comparison (exit 1 when the outputs differ)",
        "nanhunter scan ./model --prompt hi --trace old.jsonl      # torch 2.13\n"
        "nanhunter scan ./model --prompt hi --trace new.jsonl      # torch 2.14\n"
        "nanhunter diff old.jsonl new.jsonl --json diff.json --report diff.html",
    ),
    (
        "op level, with each run repeated 3 times so nondeterministic ops set their own tolerance",
        "nanhunter scan ./model --prompt hi --trace a.jsonl.gz --trace-level ops --repeat 3",
    ),
    (
        "a CI gate that fails on any divergence, even one that did not reach the outputs",
        "nanhunter diff old.jsonl new.jsonl --fail-on divergence",
    ),
)


def command(
    a: Annotated[
        str,
        typer.Argument(
            metavar="A", show_default=False, help="a trace (nanhunter.trace/v1; .gz read as gzip)"
        ),
    ],
    b: Annotated[
        str,
        typer.Argument(
            metavar="B",
            show_default=False,
            help="the trace to compare it with (rel_err is symmetric: A and B may be swapped)",
        ),
    ],
    rtol: Annotated[
        str | None,
        o.opt(
            "--rtol",
            metavar="FLOAT",
            panel=o.MODE,
            callback=o.number(float, "--rtol"),
            help="relative tolerance of every entry (default: 1e-3 for fp32/fp64 entries, 1e-2 for bf16/fp16/fp8; "
            "never below 4 x the entry's --repeat spread)",
        ),
    ] = None,
    fail_on: Annotated[
        str,
        o.opt(
            "--fail-on",
            metavar="outputs|divergence",
            panel=o.MODE,
            default="outputs",
            help="exit 1 when the model's outputs differ beyond tolerance (outputs), or at any divergence, even one "
            "that did not reach the outputs (divergence); one side non-finite where the other is not always "
            "exits 1",
        ),
    ] = "outputs",
    json: Annotated[
        str | None,
        o.opt(
            "--json",
            metavar="PATH",
            panel=o.OUTPUT,
            help="write the comparison as JSON (nanhunter.diff/v1) here ('-' for stdout)",
        ),
    ] = None,
    report: Annotated[
        str | None,
        o.opt("--report", metavar="PATH.html", panel=o.OUTPUT, help="also write a self-contained HTML page"),
    ] = None,
    quiet: o.Quiet = False,
) -> int:
    return run(o.namespace(locals()))


def run(args: Any) -> int:

    outs = [Output(flag, path) for flag, path in (("--json", args.json), ("--report", args.report)) if path]
    if args.report and not args.report.lower().endswith((".html", ".htm")):
        raise BadInput(f"--report {args.report}: diff writes HTML; give a path ending in .html")
    check_outputs(outs, [args.a, args.b])
    from ..divergence.compare import compare_traces, plot_series  # lazy: --help stays light
    from ..trace.reader import read_trace  # lazy: --help stays light

    a, b = read_trace(args.a), read_trace(args.b)
    res = compare_traces(a, b, args.rtol, args.fail_on)
    data = res.to_dict()
    to_stdout = args.json == "-"
    if args.json:
        import json

        from ..report import json_safe  # lazy: --help stays light

        write_text("--json", args.json, json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n")
    if args.report:
        from ..render.diff_html import page  # lazy: --help stays light

        write_text("--report", args.report, page(data, plot_series(res)))
    if not args.quiet:
        import sys

        from ..render.diff_view import render  # lazy: --help stays light

        (sys.stderr if to_stdout else sys.stdout).write(render(data))
    return res.exit_code
