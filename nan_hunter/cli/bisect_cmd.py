"""``nanhunter bisect``: a 1-minimal set of modules to keep in high precision, and its policy file."""

from __future__ import annotations

import argparse

from . import options
from .output import check_command_outputs, planned_outputs, write_json

HELP = "Find a 1-minimal set of modules to keep in --keep-dtype so the --dtype run is finite and accurate."


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bisect", help=HELP, description=HELP)
    options.add_checkpoint(p)
    p.add_argument("--dtype", default="fp16", help="the low precision that fails (fp16|bf16|fp8-e4m3|fp8-e5m2)")
    p.add_argument("--keep-dtype", default="fp32", help="precision to keep modules in: fp32|bf16")
    options.add_model_inputs(p)
    options.add_json(p)
    options.add_config(p)
    p.add_argument("--policy-out", metavar="PATH", help="write the policy YAML here ('-' for stdout)")
    p.add_argument("--granularity", help="leaf (default) | block")
    p.add_argument("--over", default="modules", help="modules (default) | inputs: which inputs fail")
    p.add_argument("--rtol", type=float, help="output tolerance vs the all-keep run")
    p.add_argument("--generate", type=int, metavar="N", default=None,
                   help="judge each run by greedy decoding of N tokens per input instead of one forward")
    options.add_backward(p)
    options.add_quiet(p)
    p.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    outs = planned_outputs(args, [("json", "--json"), ("policy_out", "--policy-out")])
    stdout_taken = check_command_outputs(outs, args, [args.checkpoint])
    from ..config import load_config
    from .output import terminal_limits

    cfg = load_config(args.config)  # validated before any work: a bad file exits 2 at once
    from ..bisection.runner import bisect

    prog = cb = None
    if not args.quiet:
        from ..render.progress import BisectProgress

        prog = BisectProgress()
        cb = prog.update
    try:
        rep = bisect(args.checkpoint, dtype=args.dtype, keep_dtype=args.keep_dtype, arch=args.arch,
                     inputs=args.inputs, prompts=args.prompt, data=args.data, device=args.device,
                     config=cfg, attn=args.attn, granularity=args.granularity, over=args.over,
                     rtol=args.rtol, policy_out=args.policy_out, progress=cb,
                     generate=args.generate, backward=args.backward, loss=args.loss)
    finally:
        if prog is not None:
            prog.close()
    write_json(rep, args.json)
    if not args.quiet:
        from ..render.terminal import render

        render(rep, stderr=stdout_taken, **terminal_limits(cfg))
    return rep.exit_code()
