"""``nanhunter bisect``: a 1-minimal set of modules to keep in high precision, and its policy file."""

from __future__ import annotations

import argparse

from . import options
from .output import check_command_outputs, planned_outputs, write_json

HELP = "Find a 1-minimal set of modules to keep in --keep-dtype so the --dtype run is finite and accurate."


EXAMPLES = options.examples(
    ("which modules must stay in fp32 for an fp16 run; write the policy",
     "nanhunter bisect ./my-model --prompt 'Hello' --dtype fp16 --policy-out keep.yaml"),
    ("by transformer block instead of by leaf module, keeping bf16",
     "nanhunter bisect model.safetensors --arch model.py:build --inputs batch.safetensors \\\n"
     "      --dtype fp8-e4m3 --keep-dtype bf16 --granularity block"),
    ("which inputs of a data set fail in fp16", "nanhunter bisect ./my-model --data prompts.jsonl --over inputs"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bisect", help=HELP, description=HELP, epilog=EXAMPLES)
    options.add_checkpoint(p)
    g = options.Groups(p)
    options.add_model_inputs(p, g)
    g.run.add_argument("--dtype", default="fp16", metavar="fp16|bf16|fp8-e4m3|fp8-e5m2",
                       help="the low precision that fails")
    g.run.add_argument("--keep-dtype", default="fp32", metavar="fp32|bf16", help="the precision kept modules run in")
    g.mode.add_argument("--granularity", metavar="leaf|block",
                        help="candidates: leaf modules, or whole transformer blocks (default: leaf)")
    g.mode.add_argument("--over", default="modules", metavar="modules|inputs",
                        help="modules: a minimal keep set; inputs: which inputs of the data set fail")
    g.mode.add_argument("--rtol", type=float, metavar="FLOAT",
                        help="a run passes when its outputs are within this of the all---keep-dtype run "
                             "(default: bisect.rtol in the config)")
    g.mode.add_argument("--generate", type=int, metavar="N", default=None,
                        help="judge each run by greedy decoding of N tokens per input instead of one forward")
    options.add_backward(g.mode)
    options.add_json(g.output)
    g.output.add_argument("--policy-out", metavar="PATH.yaml",
                          help="write the policy YAML here ('-' for stdout); apply it with nan_hunter.apply_policy")
    options.add_quiet(g.output)
    options.add_config(g.output)
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
    rep.add_context(command=getattr(args, "argv", None))
    write_json(rep, args.json)
    if not args.quiet:
        from ..render.terminal import render

        render(rep, stderr=stdout_taken, **terminal_limits(cfg))
    return rep.exit_code()
