"""``ScanOptions``: every option of ``nanhunter scan`` / ``nan_hunter.scan``, validated once, at
construction, with the reason for every refusal; nothing downstream checks them again. It is made
of option groups (``nan_hunter/options.py``): the shared ones of ``model/options.py`` (loading,
inputs, decoding, backward) and scan's own below (precision, placement, modes, trace); each field
carries its flag, so the typer parameters are generated from them (``cli/options.command``).

Combinations (docs/contract.md, "Modes compose"): under torchrun, ``--backward``, ``--generate``
and ``--compile`` split the data set like a plain scan; ``--device-map auto`` works with
``--backward`` and ``--generate``. What stays refused is refused here, naming the reason in torch
or the library:

- ``--backward`` with ``--generate``: transformers' ``generate()`` runs under ``torch.no_grad()``,
  so a decoding has no backward;
- ``--compile`` with an fp8 ``--dtype``: fp8 is emulated by a ``TorchDispatchMode``, which
  ``torch.compile`` does not trace;
- ``--compile`` with ``--device-map``: dynamo does not trace accelerate's offload hooks
  (``AlignDevicesHook`` moves weights in Python hooks around each forward);
- ``--device-map`` under torchrun: accelerate's ``dispatch_model`` places one model across every
  device of the machine, while torchrun gives each rank a device of its own;
- a capsule (``DIR/step-<k>``) brings its own inputs, dtype and phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..distributed.ranks import launched
from ..dtypes import RUN_DTYPES, RunDtype, parse_dtype
from ..errors import BadInput
from ..kernels.stats import parse_stats_level
from ..load.capsule import is_capsule
from ..model.inputs import one_or_many
from ..model.options import BackwardOptions, DecodeOptions, LoadOptions
from ..model.placement import parse as parse_placement
from ..options import CompileBackend, Panel, StatsLevel, TraceLevel, choice, choices, option

#: options users reach for by another tool's name (or the flag's own), and ours: ``--html`` →
#: ``--report``. The CLI suggests the flag, ``nan_hunter.scan``/``bisect`` the keyword
#: (``prompt=`` → ``prompts=``), through ``closest``.
SYNONYMS = {
    "--html": "--report",
    "--md": "--report",
    "--markdown": "--report",
    "--output": "--json",
    "--out": "--json",
    "--precision": "--dtype",
    "--junit-xml": "--junit",
    "--junitxml": "--junit",
    "--prompts": "--prompt",
    "--input": "--inputs",
}
#: keywords of the Python API spelled otherwise than a user may guess: a repeatable flag's
#: keyword is plural (``--prompt`` → ``prompts=``), ``--no-replay`` is ``replay=False``
KEYWORD_SYNONYMS = {"prompt": "prompts", "input": "inputs", "precision": "dtype", "no_replay": "replay"}


def closest(
    name: str, names: list[str] | tuple[str, ...], synonyms: dict[str, str] | None = None
) -> str | None:
    """The option meant by a mistyped ``name`` among ``names``: a known synonym first (``--html`` →
    ``--report``), else the closest spelling (difflib ratio ≥ 0.6, leading dashes ignored: every
    flag shares them), else None. Shared by the CLI (flags) and the Python API (keywords), so both
    suggest the same thing."""
    import difflib

    same = (synonyms if synonyms is not None else SYNONYMS).get(name)
    if same in names:
        return same
    bare = {n.lstrip("-"): n for n in names}
    close = difflib.get_close_matches(name.lstrip("-"), list(bare), n=1, cutoff=0.6)
    return bare[close[0]] if close else None


COMPILE_BACKENDS: tuple[str, ...] = tuple(m.value for m in CompileBackend)
#: scan options a capsule brings along itself (its inputs, its dtype, its phase), by their flags.
NOT_WITH_CAPSULE = {
    "inputs": "--inputs",
    "prompts": "--prompt",
    "data": "--data",
    "dtype": "--dtype",
    "generate": "--generate",
    "compile": "--compile",
    "backward": "--backward",
    "loss": "--loss",
    "device_map": "--device-map",
}


@dataclass(frozen=True, kw_only=True)
class ScanPrecision:
    """``--dtype``: the run's precision, parsed once (``run_dtype``)."""

    dtype: str | None = option(
        None,
        "--dtype",
        metavar="|".join(RUN_DTYPES),
        panel=Panel.RUN,
        help="precision of the run (default: the checkpoint's own dtype)",
    )

    #: the run's precision, parsed once from ``dtype`` (default fp8 recipe; the configured one is
    #: applied where the model is prepared, ``model.prepare``); None: the checkpoint's own
    run_dtype: RunDtype | None = field(default=None, init=False, compare=False)

    def check_precision(self) -> None:
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        object.__setattr__(self, "run_dtype", RunDtype.of(self.dtype) if self.dtype is not None else None)


@dataclass(frozen=True, kw_only=True)
class PlacementOptions:
    """``--device-map auto`` and its ``--max-memory`` caps."""

    device_map: str | None = option(
        None,
        "--device-map",
        metavar="auto",
        panel=Panel.RUN,
        help="place a model bigger than one device with accelerate (GPUs, then CPU memory, then disk offload); "
        "overrides --device",
    )
    max_memory: tuple[str, ...] = option(
        (),
        "--max-memory",
        metavar="DEV=SIZE",
        panel=Panel.RUN,
        repeatable=True,
        help="--device-map: memory cap per device, e.g. cpu=200MB or cuda:0=10GiB (repeatable)",
    )


@dataclass(frozen=True, kw_only=True)
class ScanModeOptions:
    """What ``scan`` runs besides the forward: statistics, the replay, ``torch.compile``."""

    stats: str = option(
        StatsLevel.FAST.value,
        "--stats",
        metavar=choices(StatsLevel),
        panel=Panel.MODE,
        help="fast: sampled underflow statistics; full: exact, slower",
    )
    replay: bool = option(
        True,
        "--no-replay",
        panel=Panel.MODE,
        inverted=True,
        help="skip the replay of the failing region per dtype",
    )
    compile: bool | str | None = option(
        False, "--compile", panel=Panel.MODE, help="also run under torch.compile and compare with eager"
    )
    compile_backend: str = option(
        CompileBackend.INDUCTOR.value,
        "--compile-backend",
        metavar=choices(CompileBackend),
        panel=Panel.MODE,
        help="--compile: the torch.compile backend",
    )
    rtol: float = option(
        1e-2,
        "--rtol",
        metavar="FLOAT",
        panel=Panel.MODE,
        number=float,
        help="--compile: the compiled run parts from eager when max |compiled − eager| / max |eager| exceeds this",
    )


@dataclass(frozen=True, kw_only=True)
class TraceOutput:
    """``--trace PATH`` and what shapes the trace."""

    trace: str | None = option(
        None,
        "--trace",
        metavar="PATH",
        panel=Panel.OUTPUT,
        help="write a numerics trace of the run (nanhunter.trace/v1, JSON lines; .gz: gzip) for `nanhunter diff`",
    )
    trace_level: str = option(
        TraceLevel.MODULES.value,
        "--trace-level",
        metavar=choices(TraceLevel),
        panel=Panel.OUTPUT,
        help="--trace: one entry per module call, or per aten op (with producer links)",
    )
    repeat: int | None = option(
        None,
        "--repeat",
        metavar="N",
        panel=Panel.OUTPUT,
        number=int,
        help="--trace: run each input N times (N >= 2) and store each entry's run-to-run spread",
    )


@dataclass(frozen=True)
class ScanOptions(
    TraceOutput, BackwardOptions, DecodeOptions, ScanModeOptions, PlacementOptions, LoadOptions, ScanPrecision
):
    """What a scan runs (docs/contract.md): its option groups, validated once. ``compile`` is the
    backend name to compare with, or None, once constructed (``compile=True`` takes
    ``compile_backend``)."""

    checkpoint: str  # a .safetensors file, a sharded index, a model directory or a capsule step-<k>
    capsule: bool = field(default=False, init=False)  # the checkpoint is a capsule directory
    placement: Any = field(default=None, init=False, compare=False)  # model.placement.Placement, or None
    tracing: Any = field(default=None, init=False, compare=False)  # modes.trace_pass.TraceOptions, or None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        self.check_loading()
        set_(self, "max_memory", one_or_many(self.max_memory, "max_memory"))
        # compile=True takes compile_backend; a backend name is compile=True with that backend
        backend = (
            self.compile if isinstance(self.compile, str) else self.compile_backend if self.compile else None
        )
        set_(self, "compile", backend)
        set_(self, "capsule", is_capsule(self.checkpoint))
        if self.capsule:
            given = {k: getattr(self, k) for k in NOT_WITH_CAPSULE}
            bad = [k for k, v in given.items() if v not in (None, False, (), [])]
            if bad:
                raise BadInput(
                    f"{NOT_WITH_CAPSULE[bad[0]]} does not apply to a capsule: {self.checkpoint} holds the "
                    "failing step's own inputs, dtype and phase; drop the flag (or scan the model's "
                    "checkpoint instead)"
                )
        self.check_precision()
        parse_stats_level(self.stats)
        self.check_loss()
        self.check_decoding()
        if self.backward and self.generate is not None:
            raise BadInput(
                "--backward with --generate: transformers' generate() runs under torch.no_grad(), so a "
                "decoding has no backward; run --backward on the prompts, and --generate separately"
            )
        placement = parse_placement(self.device_map, list(self.max_memory) or None)
        set_(self, "placement", placement)
        set_(self, "tracing", self._tracing())
        if self.compile is not None:
            set_(
                self,
                "compile",
                choice(
                    CompileBackend,
                    self.compile,
                    f"--compile-backend {self.compile!r}: use one of {', '.join(COMPILE_BACKENDS)}",
                ),
            )
            if not (isinstance(self.rtol, (int, float)) and math.isfinite(self.rtol) and self.rtol > 0):
                raise BadInput(f"--rtol {self.rtol!r}: give a positive number such as 1e-2")
            run = self.run_dtype
            if run is not None and run.is_fp8:
                raise BadInput(
                    f"--compile with --dtype {self.dtype}: fp8 runs are emulated by a dispatch mode "
                    "(TorchDispatchMode) that torch.compile does not trace; use --dtype bf16, fp16 or fp32 "
                    "with --compile"
                )
            if placement is not None:
                raise BadInput(
                    "--compile with --device-map auto: dynamo does not trace accelerate's offload hooks "
                    "(AlignDevicesHook moves weights in Python hooks around each forward); drop one of them"
                )
        if placement is not None:
            if launched():
                raise BadInput(
                    "--device-map auto under torchrun: accelerate's dispatch_model places one model across "
                    "every device of this machine, while torchrun gives each rank a device of its own; "
                    "run --device-map in one process, or torchrun without it"
                )

    def _tracing(self) -> Any:
        """``--trace``'s options (``modes.trace_pass.TraceOptions``), or None without ``--trace``."""
        if self.trace is None:
            if self.repeat is not None or self.trace_level != TraceLevel.MODULES:
                flag = "--repeat" if self.repeat is not None else "--trace-level"
                raise BadInput(f"{flag} shapes the trace: add --trace PATH")
            return None
        from ..modes.trace_pass import TraceOptions  # lazy: torch

        if launched():
            raise BadInput(
                "--trace under torchrun: each rank would run its own share of the inputs; trace one "
                "process (without torchrun)"
            )
        if self.batch and self.generate is not None:
            raise BadInput(
                "--trace with --generate --batch: the trace is written in the capture's own pass, where the "
                "prompts decode as one left-padded batch, not one by one; drop --batch to trace them"
            )
        backend = (
            self.compile if isinstance(self.compile, str) else None
        )  # a backend name after __post_init__
        return TraceOptions(self.trace, self.trace_level, self.repeat, backend)


# --- check ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CheckPrecision:
    """``--dtypes``: the precisions each checkpoint's forward runs in (the policy's ``dtypes:`` when
    not given; resolved against the configuration by ``parse_dtypes``)."""

    dtypes: str | tuple[str, ...] | None = option(
        None,
        "--dtypes",
        metavar="DTYPE,DTYPE",
        panel=Panel.RUN,
        help="comma-separated precisions to check, e.g. fp16,bf16 (default: dtypes: in configs/ci.yaml)",
    )


@dataclass(frozen=True, kw_only=True)
class BaselineOption:
    """``--baseline OLD``: a previous checkpoint each tensor is compared with."""

    baseline: str | None = option(
        None,
        "--baseline",
        metavar="OLD",
        panel=Panel.RUN,
        help="a previous checkpoint (e.g. the last release): each tensor present in both is compared, and rule "
        "headroom_regression.<dtype> fails when one now overflows a dtype it fit or its headroom fell below "
        "min_headroom_db (configs/ci.yaml, 20 dB)",
    )


@dataclass(frozen=True)
class CheckOptions(DecodeOptions, BaselineOption, LoadOptions, CheckPrecision):
    """The options of one check, shared by every checkpoint it checks: the loading and decoding
    groups of ``scan`` (``model/options.py``) and check's own, frozen, each validated once, here."""

    stats: str = "fast"
    split: Any = None  # modes.rank_split.RankSplit: the data set split across torchrun ranks (not an option)

    def __post_init__(self) -> None:
        self.check_loading()
        parse_stats_level(self.stats)
        self.check_decoding()
