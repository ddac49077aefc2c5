"""``nanhunter scan``: weights scan, one run under hooks, first non-finite producer, replay, diagnosis."""

from __future__ import annotations

from typing import Any

from ..options import values_from_cli
from ..pipeline.options import ScanOptions
from . import options as o
from .output import (
    check_command_outputs,
    planned_outputs,
    scan_progress,
    stage_progress,
    terminal_limits,
    write_json,
    write_report_file,
    wrote,
)

HELP = "Scan weights, run the model under hooks, locate the first NaN/Inf, replay and diagnose it."


EXAMPLES = o.examples(
    (
        "a model directory (config.json + safetensors) on a prompt, in fp16",
        "nanhunter scan ./my-model --prompt 'The capital of France is' --dtype fp16",
    ),
    (
        "your own architecture on a batch saved as safetensors; JSON and an HTML report",
        "nanhunter scan model.safetensors --arch model.py:build --inputs batch.safetensors \\\n"
        "    --json report.json --report report.html",
    ),
    (
        "a data set, decoding 32 tokens per line",
        "nanhunter scan ./my-model --data prompts.jsonl --generate 32",
    ),
    (
        "eager against torch.compile",
        "nanhunter scan ./my-model --prompt hi --compile --compile-backend inductor",
    ),
    ("a training step's capsule written by watch(capsule_dir=...)", "nanhunter scan capsules/step-41"),
    (
        "a numerics trace to compare with another environment's (nanhunter diff)",
        "nanhunter scan ./my-model --prompt hi --trace run.jsonl --trace-level ops --repeat 2",
    ),
)


def run(args: Any) -> int:
    outs = planned_outputs(args, [("json", "--json")]) + o.trace_output(args)
    stdout_taken = check_command_outputs(outs, args, [args.checkpoint])
    from ..config import load_config  # lazy: --help stays light

    cfg = load_config(args.config)  # validated before any work: a bad file exits 2 at once
    from ..distributed.ranks import finish, process_group, writes  # lazy: --help stays light
    from ..pipeline.scan_checkpoint import run_scan  # lazy: --help stays light
    from ..progress import using  # lazy: --help stays light

    opts = ScanOptions(args.checkpoint, **values_from_cli(ScanOptions, args))
    with process_group(args.device) as split:  # under torchrun: the data set split across ranks
        prog, cb = scan_progress() if writes() and not args.quiet else (None, None)
        stages = stage_progress(args.quiet) if writes() else None
        try:
            with using(stages):
                rep = run_scan(opts, cfg, progress=cb, split=split)
        finally:
            if prog is not None:
                prog.close()
            if stages is not None:
                stages.done()
        code = rep.exit_code()
        rep.add_context(command=getattr(args, "argv", None))
        if args.trace and writes():
            wrote("--trace", args.trace)
        if writes():  # rank 0 (or the one process) prints and writes
            write_json(rep, args.json)
            if not args.quiet:
                from ..render.terminal import render  # lazy: rich, after parsing

                render(
                    rep,
                    strip=code != 0 if args.strip is None else args.strip,
                    stderr=stdout_taken,
                    **terminal_limits(cfg),
                )
            write_report_file(rep, args.report, args.quiet)
        return finish(code)


#: the typer command: ``CHECKPOINT``, one flag per ``ScanOptions`` field, then the outputs
command = o.command(
    ScanOptions,
    lambda args: run(args),  # run looked up when called: tests replace it
    [("checkpoint", o.Checkpoint)],
    [
        ("json", o.Json, None),
        ("report", o.Report, None),
        ("strip", o.Strip, None),
        ("quiet", o.Quiet, False),
        ("config", o.Config, None),
    ],
)
