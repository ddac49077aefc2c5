"""``nanhunter scan``: weights scan, one run under hooks, first non-finite producer, replay, diagnosis."""

from __future__ import annotations

import argparse

from . import options
from .output import (
    check_command_outputs,
    planned_outputs,
    scan_progress,
    stage_progress,
    write_json,
    write_report_file,
)

HELP = "Scan weights, run the model under hooks, locate the first NaN/Inf, replay and diagnose it."


EXAMPLES = options.examples(
    ("a model directory (config.json + safetensors) on a prompt, in fp16",
     "nanhunter scan ./my-model --prompt 'The capital of France is' --dtype fp16"),
    ("your own architecture on a batch saved as safetensors; JSON and an HTML report",
     "nanhunter scan model.safetensors --arch model.py:build --inputs batch.safetensors \\\n"
     "      --json report.json --report report.html"),
    ("a data set, decoding 32 tokens per line", "nanhunter scan ./my-model --data prompts.jsonl --generate 32"),
    ("eager against torch.compile", "nanhunter scan ./my-model --prompt hi --compile --compile-backend inductor"),
    ("a training step's capsule written by watch(capsule_dir=...)", "nanhunter scan capsules/step-41"),
    ("a numerics trace to compare with another environment's (nanhunter diff)",
     "nanhunter scan ./my-model --prompt hi --trace run.jsonl --trace-level ops --repeat 2"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scan", help=HELP, description=HELP, epilog=EXAMPLES)
    options.add_checkpoint(p)
    g = options.Groups(p)
    options.add_model_inputs(p, g)
    g.run.add_argument("--dtype", metavar=options.DTYPES_HELP,
                       help="precision of the run (default: the checkpoint's own dtype)")
    options.add_device_map(g.run)
    g.mode.add_argument("--stats", default="fast", metavar="fast|full",
                        help="fast: sampled underflow statistics; full: exact, slower")
    g.mode.add_argument("--no-replay", action="store_true", help="skip the replay of the failing region per dtype")
    g.mode.add_argument("--compile", action="store_true", help="also run under torch.compile and compare with eager")
    g.mode.add_argument("--compile-backend", default="inductor", metavar="inductor|aot_eager|eager",
                        help="--compile: the torch.compile backend")
    g.mode.add_argument("--rtol", type=float, default=1e-2, metavar="FLOAT",
                        help="--compile: the compiled run parts from eager when max |compiled − eager| / max |eager| "
                             "exceeds this")
    options.add_generate(g.mode)
    options.add_backward(g.mode)
    options.add_trace(g.output)
    options.add_json(g.output)
    options.add_report(g.output)
    options.add_quiet(g.output)
    options.add_config(g.output)
    p.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    outs = planned_outputs(args, [("json", "--json")]) + options.trace_output(args)
    stdout_taken = check_command_outputs(outs, args, [args.checkpoint])
    from ..config import load_config
    from .output import terminal_limits

    cfg = load_config(args.config)  # validated before any work: a bad file exits 2 at once
    from ..modes.rank_split import finish, process_group, writes
    from ..pipeline.options import ScanOptions
    from ..pipeline.scan_checkpoint import run_scan
    from ..progress import using

    opts = ScanOptions(args.checkpoint, arch=args.arch, inputs=tuple(args.inputs or ()),
                       prompts=tuple(args.prompt or ()), data=args.data, dtype=args.dtype, device=args.device,
                       stats=args.stats, attn=args.attn, replay=not args.no_replay,
                       compile=args.compile_backend if args.compile else None, rtol=args.rtol,
                       generate=args.generate, batch=args.batch, backward=args.backward, loss=args.loss,
                       device_map=args.device_map, max_memory=tuple(args.max_memory or ()),
                       trace=args.trace, trace_level=args.trace_level, repeat=args.repeat)
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
        if writes():  # rank 0 (or the one process) prints and writes
            write_json(rep, args.json)
            if not args.quiet:
                from ..render.terminal import render

                render(rep, strip=code != 0 if args.strip is None else args.strip, stderr=stdout_taken,
                       **terminal_limits(cfg))
            write_report_file(rep, args.report)
        return finish(code)
