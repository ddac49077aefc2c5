"""``nanhunter scan`` as a function: load → weights scan → model + inputs → the harness (capture,
locate, replay, diagnose, in the mode the options ask for) → report. ``nan_hunter.scan`` and the
CLI both call ``scan`` here; a capsule directory (``DIR/step-<k>``) is rebuilt and its step re-run
behind the same harness (``modes.capsule_step``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import Config, as_config
from ..errors import BadInput
from ..progress import stage
from ..report import Report
from .options import ScanOptions

if TYPE_CHECKING:  # pragma: no cover
    from ..distributed.ranks import RankSplit


def scan(
    checkpoint: str,
    config: str | Config | None = None,
    progress: Callable[[str, int], None] | None = None,
    **options: Any,
) -> Report:
    """The scan report of ``checkpoint``; ``options`` are ``ScanOptions`` fields (``dtype``,
    ``prompts``, ``generate``, ``backward``, ``compile``...), validated before anything runs."""
    opts = ScanOptions(checkpoint, **options)
    return run_scan(opts, as_config(config), progress)


def run_scan(
    opts: ScanOptions,
    cfg: Config,
    progress: Callable[[str, int], None] | None = None,
    split: RankSplit | None = None,
) -> Report:
    """A validated scan (``ScanOptions``) under configuration ``cfg``; ``split``: the data set
    split across torchrun ranks (``modes.rank_split.process_group``)."""
    if opts.capsule:
        from ..modes.capsule_step import scan_capsule  # lazy: torch

        return scan_capsule(
            opts.checkpoint,
            arch=opts.arch,
            device=opts.device,
            stats=opts.stats,
            config=cfg,
            progress=progress,
            replay=opts.replay,
            trace=opts.tracing,
        )
    from ..explain.weights_verdict import weights_section, weights_verdict  # lazy: numpy
    from ..load.checkpoint import open_checkpoint  # lazy: numpy
    from ..load.weights import scan_weights  # lazy: numpy
    from ..load.weights_sections import bad_scales  # lazy: numpy
    from ..model.prepare import prepare  # lazy: numpy

    ck = open_checkpoint(opts.checkpoint)
    ws = scan_weights(ck, exact=opts.stats == "full", progress=progress)
    weights = weights_section(ws, cfg)
    rep = Report(checkpoint=ck.describe(), weights=weights)
    if ck.format == "gguf" and (opts.arch or opts.inputs or opts.prompts or opts.data):
        raise BadInput(
            f"{ck.path}: a GGUF file is scanned weights-only (nanhunter does not build llama.cpp "
            "models); drop --arch/--inputs/--prompt/--data"
        )
    try:
        with stage("load"):
            prepared = prepare(
                ck,
                opts.arch,
                list(opts.inputs) or None,
                list(opts.prompts) or None,
                opts.data,
                opts.dtype,
                opts.device,
                cfg,
                opts.attn,
                placement=opts.placement,
            )
    except BadInput as e:
        if not (ws.nonfinite or bad_scales(ws) or ws.quantized or ws.quantized_unchecked):
            raise
        # the weights already hold the answer (a quantized model transformers cannot build here, e.g. GPTQ
        # without optimum): the weights verdict, and one line saying why nothing ran, rather than exit 2
        rep.notes.append(f"weights-only scan: the model was not built ({e})")
        weights_verdict(rep, cfg, ws)
        return rep
    if prepared is None or not prepared.batches:
        rep.notes.append(
            "weights-only scan: no --arch and no config.json, so nothing was run"
            if prepared is None
            else prepared.notes[0]
        )
        weights_verdict(rep, cfg, ws)
        return rep
    rep.notes += prepared.notes
    from ..modes.rank_split import run_mode_on_ranks  # lazy: torch
    from ..modes.registry import mode_for  # lazy: torch

    mode = mode_for(generate=opts.generate, batch=opts.batch, backward=opts.backward, loss=opts.loss)
    trace = None
    if opts.tracing is not None:  # written in the capture's pass (or, --compile, the compiled run's)
        from ..modes.trace_pass import trace_for  # lazy: torch

        trace = trace_for(prepared, mode, opts.tracing)
    run_mode_on_ranks(
        prepared, mode, rep, replay=opts.replay, split=split, trace=trace if opts.compile is None else None
    )
    if prepared.quantized is not None and rep.run is not None:  # run in its own quantized form
        rep.run["quantized"] = prepared.quantized
    if isinstance(opts.compile, str):  # a backend name, or None, once ScanOptions is constructed
        from ..modes.compiled import compare_compiled  # lazy: torch

        with stage("compile"):
            compare_compiled(prepared, rep, opts.compile, opts.rtol, trace=trace)
    if trace is not None:
        from ..modes.trace_pass import trace_note  # lazy: torch

        rep.notes.append(trace_note(trace, opts.tracing, len(prepared.batches)))
    rep.add_context(texts=prepared.texts)
    if rep.diagnosis is None and not weights["nonfinite"]:  # a finite run: corrupt scales are still a fault
        weights_verdict(rep, cfg, ws, scales_only=True)
    return rep
