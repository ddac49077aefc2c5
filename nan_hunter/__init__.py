"""nanhunter: find the first module and aten op that turned finite values into NaN/Inf.

Public API (torch is imported only when these are called): ``watch(model)``, ``scan(checkpoint)``,
``bisect(checkpoint)``, ``check(checkpoints)``, ``diff(a, b)``, ``apply_policy(model, policy)``, ``Report``. Keywords take
the names of the command line's flags (``--keep-dtype`` → ``keep_dtype=``; a repeatable flag's
keyword is plural: ``--prompt`` → ``prompts=``); a mistyped one is a ``TypeError`` naming the one
meant, as the CLI does for a flag. ``scan``'s, ``bisect``'s and ``check``'s keywords are the fields
of ``ScanOptions``, ``BisectOptions`` and ``CheckOptions`` (one field per option,
``nan_hunter/options.py``), with the same defaults: tests/unit/test_options.py holds signatures,
defaults and docstrings against them.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from os import PathLike
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import NonFiniteError
from .version import __version__

__all__ = [
    "watch",
    "scan",
    "bisect",
    "check",
    "diff",
    "apply_policy",
    "Report",
    "NonFiniteError",
    "__version__",
]

if TYPE_CHECKING:  # pragma: no cover
    from .config import Config
    from .render.report_view import PrintableReport
    from .report import Report
    from .session.watcher import Watch

F = TypeVar("F", bound=Callable[..., Any])

#: command-line outputs that are a report's methods in Python
_OUTPUT_KEYWORDS = {
    "json": "write it with report.to_json(path)",
    "report": "write it with report.to_html(path)",
    "html": "write it with report.to_html(path)",
    "md": "write it with report.to_html('report.md')",
    "quiet": "print(report) shows the terminal view",
    "strip": "print(report) shows the terminal view (the strip for a failing run)",
}


def _keywords_checked(fn: F) -> F:
    """A mistyped keyword is a ``TypeError`` that names the keyword meant (``prompt=`` → did you
    mean ``prompts=``?), with the CLI's suggestions (``pipeline.options.closest``); an output flag
    (``json=``) names the report method that writes it."""
    params = inspect.signature(fn).parameters
    names = [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            from .pipeline.options import KEYWORD_SYNONYMS, closest  # lazy: `import nan_hunter` stays light

            k = unknown[0]
            meant = closest(k, names, KEYWORD_SYNONYMS)
            if k.startswith("no_") and k[3:] in names:  # --no-replay
                hint = f"; use {k[3:]}=False"
            elif meant is not None:
                hint = f"; did you mean {meant}=?"
            elif k in _OUTPUT_KEYWORDS:
                hint = f"; {fn.__name__}() returns the report: {_OUTPUT_KEYWORDS[k]}"
            else:
                hint = f"; its keywords are {', '.join(names[1:] if names[0] in ('model', 'checkpoint', 'checkpoints') else names)}"
            raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {k!r}{hint}")
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]


@_keywords_checked
def watch(
    model: Any,
    *,
    level: str | None = None,
    sample_every: int | None = None,
    retain: int = 4,
    backend: str | None = None,
    device: Any = None,
    dtype: str | None = None,
    fp8: Any = None,
    backward: bool = False,
    optimizer: Any = None,
    scaler: Any = None,
    capsule_dir: str | None = None,
    arch: str | None = None,
    on_fault: str = "record",
    trace: str | None = None,
    trace_level: str = "modules",
) -> Watch:
    """Watch ``model``: inside ``with nan_hunter.watch(model) as w:`` every module's forward is
    captured (fused statistics per output tensor, no host sync per hook on GPU); ``w.report()``
    then names the first module and aten op that produced NaN/Inf, replays it across dtypes,
    diagnoses it and checks the fix. ``print(w.report())`` shows it as ``nanhunter scan`` does;
    ``.to_html(path)`` / ``.to_json(path)`` write the same files.

    Args:
        model: the ``nn.Module`` to watch (also a ``torch.compile``d one, DDP or FSDP2).
        level: what is hooked while the model runs (default: ``"sentinel"``; ``"blocks"`` under an
            initialised torch.distributed group, where a replay cannot copy sharded weights):
            ``"sentinel"`` (nearly free): only the root;
            per step the outputs, after backward every gradient and after ``optimizer.step()``
            every parameter and optimizer-state tensor are judged by one fused reduction each;
            the failing step is replayed in full on ``report()`` (same fields as ``"blocks"``; a
            replay that stays finite gives cause ``not_reproducible``).
            ``"blocks"``: the transformer blocks and the root; a fault is
            refined to the leaf module and the aten op on ``report()`` by re-running the failing
            forward. ``"modules"``: every module. ``"ops"``: every aten op as well (a dispatch
            mode reads each op's result on the host: slowest, and not under CUDA-graph capture;
            names the op at once, with no re-run).
        sample_every: level ``"sentinel"``: hook the blocks too on every N-th step, for
            statistics (headroom, aggregates) and latent faults (a non-finite block output masked
            before the model's outputs: ``run.latent``, not a fault); 0: never; default 100.
        retain: how many recent forwards to keep in full (inputs and per-call statistics); older
            ones fold into per-module aggregates.
        backend: statistics kernels, ``"triton"`` or ``"reference"`` (torch) (default: Triton on a
            GPU when installed, else the torch reference).
        device: where statistics are kept (default: the model's device).
        dtype: the precision the model runs in (``"fp32"``, ``"bf16"``, ``"fp16"``,
            ``"fp8-e4m3"``, ``"fp8-e5m2"``), against which headroom and faults are judged (default:
            the parameters' dtype, or the autocast dtype each forward ran under).
        fp8: the fp8 emulation recipe (``dtypes.Fp8Recipe``) for the fp8 dtypes.
        backward: also capture the backward pass (gradients per module; the op and autograd node
            that first produced a non-finite gradient).
        optimizer: the optimizer whose ``step()`` is captured (the first parameter an update made
            non-finite); needed by ``on_fault="skip"``.
        scaler: the ``torch.amp.GradScaler`` in use; the steps it skips while the unscaled
            gradients are finite are notes (``run.scaler_skipped_steps``), not faults.
        capsule_dir: at the first fault, write ``DIR/step-<k>/`` (weights as the step began, its
            batch, how to rebuild the model) for ``nanhunter scan DIR/step-<k>`` on any machine.
        arch: ``"file.py:factory"`` recorded in the capsule for a model transformers cannot
            rebuild from its config.
        on_fault: what to do at the first fault: ``"record"`` (default: note it, run on),
            ``"raise"`` (``NonFiniteError`` carrying the report), ``"stop"`` (``w.should_stop``
            becomes true; with ``optimizer=`` that step's update is undone) or ``"skip"``
            (needs ``optimizer=``: every faulty step's update is undone and training goes on;
            ``run.skipped_steps`` lists them) or ``"abort"`` (continuous batching: the request
            that fails alone ends with an error naming the cause, the others are served as
            without it; docs/serving.md).
        trace: write a numerics trace (``nanhunter.trace/v1``, docs/trace-format.md) of every
            forward while watched, one step per root call, for ``nanhunter diff``; written as the
            steps end and closed when the watch ends.
        trace_level: ``"modules"`` (one trace entry per module call) or ``"ops"`` (per aten op).
    """
    from .session.options import WatchOptions  # lazy: `import nan_hunter` stays light
    from .session.watcher import Watch  # lazy: `import nan_hunter` stays light

    w = Watch(
        model,
        WatchOptions(
            level=level,
            sample_every=sample_every,
            retain=retain,
            backend=backend,
            device=device,
            dtype=dtype,
            fp8=fp8,
            backward=backward,
            optimizer=optimizer,
            scaler=scaler,
            capsule_dir=capsule_dir,
            arch=arch,
            on_fault=on_fault,
            trace=trace,
            trace_level=trace_level,
            collective=True,
        ),
    )  # under torch.distributed its report() is global; the CLI's stay per rank
    return w


@_keywords_checked
def scan(
    checkpoint: str | PathLike,
    *,
    arch: str | None = None,
    attn: str | None = None,
    inputs: Any = None,
    prompts: Any = None,
    data: str | PathLike | None = None,
    dtype: str | None = None,
    device: str = "auto",
    device_map: str | None = None,
    max_memory: Any = None,
    stats: str = "fast",
    replay: bool = True,
    compile: bool | str = False,
    compile_backend: str = "inductor",
    rtol: float = 1e-2,
    generate: int | None = None,
    batch: bool = False,
    backward: bool = False,
    loss: str | None = None,
    trace: str | None = None,
    trace_level: str = "modules",
    repeat: int | None = None,
    config: str | Config | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> PrintableReport:
    """``nanhunter scan CHECKPOINT`` as a function: scan the weights, run the model under hooks,
    locate the first NaN/Inf, replay and diagnose it. Returns the ``Report``: ``print(report)``
    shows the terminal view, ``report.to_html(path)`` / ``report.to_json(path)`` write what
    ``--report`` / ``--json`` write, ``report.exit_code()`` is the command's exit code. Bad input
    raises ``nan_hunter.errors.BadInput`` with the command's one-line message.

    Args:
        checkpoint: a ``.safetensors`` file, a ``*.safetensors.index.json``, a model directory
            (``config.json`` + safetensors), a ``.gguf`` file or a capsule ``DIR/step-<k>``.
        arch: ``"file.py:factory"`` or ``"package.module:factory"`` building the model the weights
            load into (``--arch``; default: the directory's ``config.json``).
        attn: transformers ``attn_implementation``, ``"eager"`` or ``"sdpa"`` (``--attn``).
        inputs: ``.safetensors`` files of ``forward()`` keyword arguments, one input each; a
            single path is one file (``--inputs``, repeatable).
        prompts: texts for the checkpoint's tokenizer; a single string is one prompt (``--prompt``,
            repeatable).
        data: a ``.jsonl`` file of ``{"text": ...}`` lines, one input each (``--data``).
        dtype: the run's precision, ``"fp32"``, ``"bf16"``, ``"fp16"``, ``"fp8-e4m3"`` or
            ``"fp8-e5m2"`` (``--dtype``; default: the checkpoint's own).
        device: ``"auto"`` (cuda when available), ``"cpu"`` or ``"cuda"`` (``--device``).
        device_map: ``"auto"``: place a model bigger than one device with accelerate
            (``--device-map``).
        max_memory: with ``device_map``, caps per device such as ``"cpu=200MB"`` (``--max-memory``).
        stats: ``"fast"`` (sampled underflow statistics) or ``"full"`` (exact) (``--stats``).
        replay: re-run the failing region in every dtype (``replay=False`` is ``--no-replay``).
        compile: also run under ``torch.compile`` and compare with eager (``--compile``); a
            backend name (``"aot_eager"``) is ``compile=True, compile_backend=...``.
        compile_backend: ``"inductor"``, ``"aot_eager"`` or ``"eager"`` (``--compile-backend``).
        rtol: with ``compile``, the compiled run parts from eager above this relative error
            (``--rtol``).
        generate: greedy decoding of up to N new tokens per input, every step captured
            (``--generate N``).
        batch: with ``generate``, decode the inputs together, left-padded (``--batch``).
        backward: forward then backward of a loss per input, the backward captured too
            (``--backward``).
        loss: with ``backward``, ``"file.py:fn"`` computing ``fn(outputs, batch) -> scalar``
            (``--loss``; default: a causal LM's own loss).
        trace: write a numerics trace of the run for ``nan_hunter.diff`` (``--trace PATH``).
        trace_level: ``"modules"`` or ``"ops"`` (``--trace-level``).
        repeat: with ``trace``, run each input N times and store the run-to-run spread
            (``--repeat N``).
        config: a YAML file merged over configs/default.yaml, or a ``config.Config``
            (``--config``).
        progress: called as ``progress(tensor_name, bytes_done)`` while the weights are scanned.
    """
    from .pipeline.scan_checkpoint import scan as _scan  # lazy: `import nan_hunter` stays light
    from .render.report_view import printable  # lazy: `import nan_hunter` stays light

    return printable(
        _scan(
            os.fspath(checkpoint),
            config=config,
            progress=progress,
            arch=arch,
            attn=attn,
            inputs=inputs,
            prompts=prompts,
            data=data,
            dtype=dtype,
            device=device,
            device_map=device_map,
            max_memory=max_memory,
            stats=stats,
            replay=replay,
            compile=compile,
            compile_backend=compile_backend,
            rtol=rtol,
            generate=generate,
            batch=batch,
            backward=backward,
            loss=loss,
            trace=trace,
            trace_level=trace_level,
            repeat=repeat,
        )
    )


@_keywords_checked
def diff(a: str | PathLike, b: str | PathLike, *, rtol: float | None = None, fail_on: str = "outputs") -> Any:
    """``nanhunter diff A B`` as a function: where two traces (``scan(..., trace=PATH)``,
    ``watch(model, trace=PATH)``) part. Returns a ``divergence.compare.DiffResult`` that prints as the terminal view does
    (``.first_divergence``, ``.outputs``, ``.exit_code`` — by ``fail_on``, ``"outputs"`` or
    ``"divergence"`` —, ``.to_dict()`` is ``nanhunter.diff/v1``); raises ``BadInput`` for files
    that cannot be compared."""
    from .divergence.compare import compare_traces  # lazy: `import nan_hunter` stays light
    from .render.diff_view import printable  # lazy: `import nan_hunter` stays light
    from .trace.reader import read_trace  # lazy: `import nan_hunter` stays light

    return printable(compare_traces(read_trace(a), read_trace(b), rtol, fail_on))


@_keywords_checked
def bisect(
    checkpoint: str | PathLike,
    *,
    dtype: str = "fp16",
    keep_dtype: str = "fp32",
    arch: str | None = None,
    attn: str | None = None,
    inputs: Any = None,
    prompts: Any = None,
    data: str | PathLike | None = None,
    device: str = "auto",
    granularity: str | None = None,
    over: str = "modules",
    rtol: float | None = None,
    generate: int | None = None,
    backward: bool = False,
    loss: str | None = None,
    policy_out: str | None = None,
    config: str | Config | None = None,
    progress: Callable[[int, str], None] | None = None,
) -> PrintableReport:
    """``nanhunter bisect CHECKPOINT`` as a function: a 1-minimal set of modules to keep in
    ``keep_dtype`` so that the run in ``dtype`` is finite and within ``rtol`` of the run all in
    ``keep_dtype``. Returns the ``Report`` (``report.bisect.keep_modules``; ``print(report)``,
    ``report.to_html(path)`` and ``report.to_json(path)`` as for ``scan``).

    Args:
        checkpoint, arch, attn, inputs, prompts, data, device, generate, backward, loss, config:
            as for ``scan``.
        dtype: the low precision that fails (``--dtype``): ``"fp16"``, ``"bf16"``, ``"fp8-e4m3"``
            or ``"fp8-e5m2"``.
        keep_dtype: the precision kept modules run in, ``"fp32"`` or ``"bf16"`` (``--keep-dtype``).
        granularity: candidates are ``"leaf"`` modules or whole transformer ``"block"``s
            (``--granularity``; default: ``bisect.granularity`` in the config).
        over: ``"modules"`` (a minimal keep set) or ``"inputs"`` (which inputs of the data set
            fail) (``--over``).
        rtol: a run passes when its outputs are within this relative error of the run all in
            ``keep_dtype`` (``--rtol``; default: ``bisect.rtol`` in the config).
        generate: judge each run by greedy decoding of N tokens per input instead of one forward.
        policy_out: write the policy YAML here, for ``apply_policy`` (``--policy-out``).
        progress: called as ``progress(runs_done, what)`` after each trial run.
    """
    from .bisection.runner import bisect as _bisect  # lazy: `import nan_hunter` stays light
    from .render.report_view import printable  # lazy: `import nan_hunter` stays light

    return printable(
        _bisect(
            os.fspath(checkpoint),
            dtype=dtype,
            keep_dtype=keep_dtype,
            arch=arch,
            inputs=inputs,
            prompts=prompts,
            data=data,
            device=device,
            config=config,
            attn=attn,
            granularity=granularity,
            over=over,
            rtol=rtol,
            policy_out=policy_out,
            progress=progress,
            generate=generate,
            backward=backward,
            loss=loss,
        )
    )


@_keywords_checked
def check(
    checkpoints: str | PathLike | list[str | PathLike],
    *,
    arch: str | None = None,
    attn: str | None = None,
    inputs: Any = None,
    prompts: Any = None,
    data: str | PathLike | None = None,
    dtypes: Any = None,
    device: str = "auto",
    baseline: str | PathLike | None = None,
    generate: int | None = None,
    batch: bool = False,
    config: str | Config | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> list[PrintableReport]:
    """``nanhunter check CHECKPOINT...`` as a function: the CI smoke check (the weights scan, then one
    forward per dtype where a model and inputs are given, judged by the policy in configs/ci.yaml).
    Returns one report per checkpoint, in order; ``report.check["passed"]`` is its verdict (the
    command exits 1 when one has not passed), ``print(report)`` and ``report.to_json(path)`` as for
    ``scan``.

    Args:
        checkpoints: checkpoints to check (files or model directories); a single one is one.
        arch, attn, inputs, prompts, data, device, generate, batch: as for ``scan``.
        dtypes: the precisions to check, ``"fp16,bf16"`` or a list (``--dtypes``; default: ``dtypes:``
            in configs/ci.yaml).
        baseline: a previous checkpoint (e.g. the last release); each tensor present in both is
            compared (rule ``headroom_regression.<dtype>``) (``--baseline``).
        config: a YAML policy merged over configs/ci.yaml, or a ``config.Config`` (``--config``).
        progress: called as ``progress(tensor_name, bytes_done)`` while the weights are scanned.
    """
    from .pipeline.ci_check import check as _check  # lazy: `import nan_hunter` stays light
    from .render.report_view import printable  # lazy: `import nan_hunter` stays light

    return [
        printable(r)
        for r in _check(
            [os.fspath(c) for c in checkpoints] if isinstance(checkpoints, list) else os.fspath(checkpoints),
            dtypes=dtypes,
            config=config,
            progress=progress,
            baseline=os.fspath(baseline) if baseline is not None else None,
            arch=arch,
            attn=attn,
            inputs=inputs,
            prompts=prompts,
            data=data,
            device=device,
            generate=generate,
            batch=batch,
        )
    ]


def apply_policy(model: Any, policy: Any) -> Any:
    """Make the modules a bisect policy lists compute in their kept dtype."""
    from .model.policy import apply_policy as _apply  # lazy: `import nan_hunter` stays light

    return _apply(model, policy)


def __getattr__(name: str) -> Any:
    if name == "Report":
        from .report import Report  # lazy: `import nan_hunter` stays light

        return Report
    raise AttributeError(name)
