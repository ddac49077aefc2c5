"""``nanhunter bisect`` (registered on the main app)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import BadInput
from .main import (
    ArchOpt,
    AttnOpt,
    CheckpointArg,
    ConfigOpt,
    DataOpt,
    DeviceOpt,
    InputsOpt,
    JsonOpt,
    PromptOpt,
    _emit,
    _fail,
    app,
)


@app.command()
def bisect(
    checkpoint: CheckpointArg,
    dtype: Annotated[str, typer.Option("--dtype", help="the low precision that fails (fp16|bf16|fp8-e4m3|fp8-e5m2)")] = "fp16",
    keep_dtype: Annotated[str, typer.Option("--keep-dtype", help="precision to keep modules in: fp32|bf16")] = "fp32",
    arch: ArchOpt = None,
    inputs: InputsOpt = None,
    prompt: PromptOpt = None,
    data: DataOpt = None,
    device: DeviceOpt = "auto",
    json: JsonOpt = None,
    config: ConfigOpt = None,
    attn: AttnOpt = None,
    policy_out: Annotated[str | None, typer.Option("--policy-out", help="write the policy YAML here")] = None,
    granularity: Annotated[str | None, typer.Option("--granularity", help="leaf (default) | block")] = None,
    over: Annotated[str, typer.Option("--over", help="modules (default) | inputs: which inputs fail")] = "modules",
    rtol: Annotated[float | None, typer.Option("--rtol", help="output tolerance vs the all-keep run")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Find a 1-minimal set of modules to keep in --keep-dtype so the --dtype run is finite and accurate."""
    try:
        from ..report import check_json_target

        check_json_target(json)
        from ..bisection.runner import bisect as run_bisect

        prog = None
        cb = None
        if not quiet:
            from ..render.progress import BisectProgress

            prog = BisectProgress()
            cb = prog.update
        try:
            rep = run_bisect(checkpoint, dtype=dtype, keep_dtype=keep_dtype, arch=arch, inputs=inputs,
                             prompts=prompt, data=data, device=device, config=config, attn=attn,
                             granularity=granularity, over=over, rtol=rtol, policy_out=policy_out, progress=cb)
        finally:
            if prog is not None:
                prog.close()
        code = _emit(rep, json, quiet)
    except BadInput as e:
        _fail(str(e))
    raise typer.Exit(code)
