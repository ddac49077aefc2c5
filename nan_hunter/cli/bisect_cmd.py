"""``nanhunter bisect``: a 1-minimal set of modules to keep in high precision, and its policy file."""

from __future__ import annotations

from typing import Any

from ..bisection.options import BisectOptions
from ..options import values_from_cli
from . import options as o
from .output import check_command_outputs, planned_outputs, say, terminal_limits, was_written, write_json

HELP = "Find a 1-minimal set of modules to keep in --keep-dtype so the --dtype run is finite and accurate."


EXAMPLES = o.examples(
    (
        "which modules must stay in fp32 for an fp16 run; write the policy",
        "nanhunter bisect ./my-model --prompt 'Hello' --dtype fp16 --policy-out keep.yaml",
    ),
    (
        "by transformer block instead of by leaf module, keeping bf16",
        "nanhunter bisect model.safetensors --arch model.py:build --inputs batch.safetensors \\\n"
        "    --dtype fp8-e4m3 --keep-dtype bf16 --granularity block",
    ),
    (
        "which inputs of a data set fail in fp16",
        "nanhunter bisect ./my-model --data prompts.jsonl --over inputs",
    ),
)


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
        rep = bisect(args.checkpoint, config=cfg, progress=cb, **values_from_cli(BisectOptions, args))
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


#: the typer command: ``CHECKPOINT``, one flag per ``BisectOptions`` field, then the outputs
command = o.command(
    BisectOptions,
    lambda args: run(args),  # run looked up when called: tests replace it
    [("checkpoint", o.Checkpoint)],
    [("json", o.Json, None), "policy_out", ("quiet", o.Quiet, False), ("config", o.Config, None)],
)
