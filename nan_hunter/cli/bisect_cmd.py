"""``nanhunter bisect``: a 1-minimal set of modules to keep in high precision, and its policy file."""

from __future__ import annotations

from typing import Annotated, Any

from . import options as o
from .output import check_command_outputs, planned_outputs, say, terminal_limits, was_written, write_json

HELP = "Find a 1-minimal set of modules to keep in --keep-dtype so the --dtype run is finite and accurate."


EXAMPLES = o.examples(
    ("which modules must stay in fp32 for an fp16 run; write the policy",
     "nanhunter bisect ./my-model --prompt 'Hello' --dtype fp16 --policy-out keep.yaml"),
    ("by transformer block instead of by leaf module, keeping bf16",
     "nanhunter bisect model.safetensors --arch model.py:build --inputs batch.safetensors \\\n"
     "    --dtype fp8-e4m3 --keep-dtype bf16 --granularity block"),
    ("which inputs of a data set fail in fp16", "nanhunter bisect ./my-model --data prompts.jsonl --over inputs"),
)


def command(
    checkpoint: o.Checkpoint,
    arch: o.Arch = None,
    attn: o.Attn = None,
    inputs: o.Inputs = None,
    prompt: o.Prompt = None,
    data: o.Data = None,
    dtype: Annotated[str, o.opt("--dtype", metavar="fp16|bf16|fp8-e4m3|fp8-e5m2", panel=o.RUN, default="fp16",
                                help="the low precision that fails")] = "fp16",
    keep_dtype: Annotated[str, o.opt("--keep-dtype", metavar="fp32|bf16", panel=o.RUN, default="fp32",
                                     help="the precision kept modules run in")] = "fp32",
    device: o.Device = "auto",
    granularity: Annotated[str | None, o.opt(
        "--granularity", metavar="leaf|block", panel=o.MODE,
        help="candidates: leaf modules, or whole transformer blocks (default: leaf)")] = None,
    over: Annotated[str, o.opt("--over", metavar="modules|inputs", panel=o.MODE, default="modules",
                               help="modules: a minimal keep set; inputs: which inputs of the data set fail")] = "modules",
    rtol: Annotated[str | None, o.opt(
        "--rtol", metavar="FLOAT", panel=o.MODE, callback=o.number(float, "--rtol"),
        help="a run passes when its outputs are within this of the run all in --keep-dtype "
             "(default: bisect.rtol in the config)")] = None,
    generate: Annotated[str | None, o.opt(
        "--generate", metavar="N", panel=o.MODE, callback=o.number(int, "--generate"),
        help="judge each run by greedy decoding of N tokens per input instead of one forward")] = None,
    backward: o.Backward = False,
    loss: o.Loss = None,
    json: o.Json = None,
    policy_out: Annotated[str | None, o.opt(
        "--policy-out", metavar="PATH.yaml", panel=o.OUTPUT,
        help="write the policy YAML here ('-' for stdout); apply it with nan_hunter.apply_policy")] = None,
    quiet: o.Quiet = False,
    config: o.Config = None,
) -> int:
    return run(o.namespace(locals()))


def run(args: Any) -> int:
    outs = planned_outputs(args, [("json", "--json"), ("policy_out", "--policy-out")])
    stdout_taken = check_command_outputs(outs, args, [args.checkpoint])
    from ..config import load_config  # lazy: --help stays light

    cfg = load_config(args.config)  # validated before any work: a bad file exits 2 at once
    from ..bisection.runner import bisect  # lazy: torch, after parsing

    prog = cb = None
    if not args.quiet:
        from ..render.progress import BisectProgress  # lazy: rich, after parsing

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
        from ..render.terminal import render  # lazy: rich, after parsing

        render(rep, stderr=stdout_taken, **terminal_limits(cfg))
    _no_policy(rep, args)
    return rep.exit_code()


def _no_policy(rep: Any, args: Any) -> None:
    """``--policy-out`` given but no policy written: say why (nothing is left unsaid)."""

    if not args.policy_out or args.policy_out == "-" or args.quiet or was_written("--policy-out"):
        return
    b = rep.bisect
    if b is not None and b.over == "inputs":
        why = "--over inputs lists the failing inputs; a policy comes from --over modules"
    elif b is not None and b.already_finite:
        why = f"the run in {b.dtype} is already finite: there is nothing to keep in {b.keep_dtype}"
    else:
        why = f"no set of modules kept in {args.keep_dtype} makes the run finite"
    say(f"--policy-out {args.policy_out}: not written: {why}")
