"""``nanhunter scan``: weights scan, one run under hooks, first non-finite producer, replay, diagnosis."""

from __future__ import annotations

import argparse

from . import options
from .output import (
    check_command_outputs,
    planned_outputs,
    scan_progress,
    write_json,
    write_report_file,
)

HELP = "Scan weights, run the model under hooks, locate the first NaN/Inf, replay and diagnose it."


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scan", help=HELP, description=HELP)
    options.add_checkpoint(p)
    options.add_model_inputs(p)
    p.add_argument("--dtype", help=f"{options.DTYPES_HELP} (default: the checkpoint's)")
    options.add_json(p)
    options.add_config(p)
    p.add_argument("--stats", default="fast", help="fast (sampled underflow, default) | full (exact, slower)")
    p.add_argument("--no-replay", action="store_true", help="skip the dtype replay")
    p.add_argument("--compile", action="store_true", help="also run under torch.compile and compare with eager")
    p.add_argument("--compile-backend", default="inductor", help="inductor (default) | aot_eager | eager")
    p.add_argument("--rtol", type=float, default=1e-2, help="--compile: compiled parts from eager above this")
    options.add_generate(p)
    options.add_backward(p)
    options.add_device_map(p)
    options.add_quiet(p)
    options.add_report(p)
    p.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    outs = planned_outputs(args, [("json", "--json")])
    stdout_taken = check_command_outputs(outs, args, [args.checkpoint])
    from ..config import load_config
    from .output import terminal_limits

    cfg = load_config(args.config)  # validated before any work: a bad file exits 2 at once
    from ..distributed.rank_split import finish, process_group, writes
    from ..pipeline.options import ScanOptions
    from ..pipeline.scan_checkpoint import run_scan

    opts = ScanOptions(args.checkpoint, arch=args.arch, inputs=tuple(args.inputs or ()),
                       prompts=tuple(args.prompt or ()), data=args.data, dtype=args.dtype, device=args.device,
                       stats=args.stats, attn=args.attn, replay=not args.no_replay,
                       compile=args.compile_backend if args.compile else None, rtol=args.rtol,
                       generate=args.generate, batch=args.batch, backward=args.backward, loss=args.loss,
                       device_map=args.device_map, max_memory=tuple(args.max_memory or ()))
    with process_group(args.device) as split:  # under torchrun: the data set split across ranks
        prog, cb = scan_progress() if writes() else (None, None)
        try:
            rep = run_scan(opts, cfg, progress=cb, split=split)
        finally:
            if prog is not None:
                prog.close()
        code = rep.exit_code()
        if writes():  # rank 0 (or the one process) prints and writes
            write_json(rep, args.json)
            if not args.quiet:
                from ..render.terminal import render

                render(rep, strip=code != 0 if args.strip is None else args.strip, stderr=stdout_taken,
                       **terminal_limits(cfg))
            write_report_file(rep, args.report)
        return finish(code)
