"""``ScanOptions``: every option of ``nanhunter scan`` / ``nan_hunter.scan``, validated once, at
construction, with the reason for every refusal; nothing downstream checks them again.

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
from ..dtypes import RunDtype, parse_dtype
from ..errors import BadInput
from ..kernels.stats import parse_stats_level
from ..load.capsule import is_capsule
from ..model.inputs import one_or_many, one_path
from ..model.placement import parse as parse_placement

#: options users reach for by another tool's name (or the flag's own), and ours: ``--html`` →
#: ``--report``. The CLI suggests the flag, ``nan_hunter.scan``/``bisect`` the keyword
#: (``prompt=`` → ``prompts=``), through ``closest``.
SYNONYMS = {"--html": "--report", "--md": "--report", "--markdown": "--report", "--output": "--json",
            "--out": "--json", "--precision": "--dtype", "--junit-xml": "--junit", "--junitxml": "--junit",
            "--prompts": "--prompt", "--input": "--inputs"}
#: keywords of the Python API spelled otherwise than a user may guess: a repeatable flag's
#: keyword is plural (``--prompt`` → ``prompts=``), ``--no-replay`` is ``replay=False``
KEYWORD_SYNONYMS = {"prompt": "prompts", "input": "inputs", "precision": "dtype", "no_replay": "replay"}


def closest(name: str, names: list[str] | tuple[str, ...], synonyms: dict[str, str] | None = None) -> str | None:
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


COMPILE_BACKENDS: tuple[str, ...] = ("inductor", "aot_eager", "eager")
#: scan options a capsule brings along itself (its inputs, its dtype, its phase), by their flags.
NOT_WITH_CAPSULE = {"inputs": "--inputs", "prompts": "--prompt", "data": "--data", "dtype": "--dtype",
                    "generate": "--generate", "compile": "--compile", "backward": "--backward", "loss": "--loss",
                    "device_map": "--device-map"}


@dataclass(frozen=True)
class ScanOptions:
    """What a scan runs (docs/contract.md; flags in parentheses)."""

    checkpoint: str  # a .safetensors file, a sharded index, a model directory or a capsule step-<k>
    arch: str | None = None  # (--arch) file.py:factory or package.module:factory
    inputs: tuple[str, ...] = ()  # (--inputs) .safetensors files of forward() keyword arguments
    prompts: tuple[str, ...] = ()  # (--prompt) texts for the checkpoint's tokenizer
    data: str | None = None  # (--data) a .jsonl file of {"text": ...}
    dtype: str | None = None  # (--dtype) canonical run dtype; None: the checkpoint's own
    device: str = "auto"  # (--device) auto | cpu | cuda
    stats: str = "fast"  # (--stats) fast: sampled underflow statistics; full: exact
    attn: str | None = None  # (--attn) transformers attn_implementation
    replay: bool = True  # (--no-replay) re-run the failing region in every dtype
    compile: str | None = None  # (--compile --compile-backend) the torch.compile backend to compare with
    rtol: float = 1e-2  # (--rtol) compiled parts from eager above this relative error
    generate: int | None = None  # (--generate N) greedy decoding of up to N new tokens per input
    batch: bool = False  # (--batch) decode the inputs together, left-padded
    device_map: str | None = None  # (--device-map auto) place the model with accelerate
    max_memory: tuple[str, ...] = ()  # (--max-memory DEV=SIZE) caps per device for --device-map
    backward: bool = False  # (--backward) forward then backward of a loss
    loss: str | None = None  # (--loss file.py:fn) the loss --backward differentiates
    trace: str | None = None  # (--trace PATH) write a numerics trace of the run (docs/trace-format.md)
    trace_level: str = "modules"  # (--trace-level) modules: one entry per module call; ops: per aten op
    repeat: int | None = None  # (--repeat N) --trace: run each input N times; per-entry spread
    capsule: bool = field(default=False, init=False)  # the checkpoint is a capsule directory
    placement: Any = field(default=None, init=False, compare=False)  # model.placement.Placement, or None
    tracing: Any = field(default=None, init=False, compare=False)  # modes.trace_pass.TraceOptions, or None

    def __post_init__(self) -> None:

        set_ = object.__setattr__
        set_(self, "inputs", one_or_many(self.inputs, "inputs"))
        set_(self, "prompts", one_or_many(self.prompts, "prompts"))  # a string is one prompt
        set_(self, "max_memory", one_or_many(self.max_memory, "max_memory"))
        set_(self, "data", one_path(self.data, "data"))
        set_(self, "capsule", is_capsule(self.checkpoint))
        if self.capsule:
            given = {k: getattr(self, k) for k in NOT_WITH_CAPSULE}
            bad = [k for k, v in given.items() if v not in (None, False, (), [])]
            if bad:
                raise BadInput(f"{NOT_WITH_CAPSULE[bad[0]]} does not apply to a capsule: {self.checkpoint} holds the "
                               "failing step's own inputs, dtype and phase; drop the flag (or scan the model's "
                               "checkpoint instead)")
        set_(self, "dtype", parse_dtype(self.dtype))
        parse_stats_level(self.stats)
        if self.loss is not None and not self.backward:
            raise BadInput("--loss is the loss --backward differentiates: add --backward")
        if self.generate is not None and (isinstance(self.generate, bool) or not isinstance(self.generate, int)
                                          or self.generate < 1):
            raise BadInput(f"--generate {self.generate!r}: give the number of new tokens to decode, e.g. --generate 16")
        if self.batch and self.generate is None:
            raise BadInput("--batch decodes the inputs together: it needs --generate N")
        if self.backward and self.generate is not None:
            raise BadInput("--backward with --generate: transformers' generate() runs under torch.no_grad(), so a "
                           "decoding has no backward; run --backward on the prompts, and --generate separately")
        placement = parse_placement(self.device_map, list(self.max_memory) or None)
        set_(self, "placement", placement)
        set_(self, "tracing", self._tracing())
        if self.compile is not None:
            if self.compile not in COMPILE_BACKENDS:
                raise BadInput(f"--compile-backend {self.compile!r}: use one of {', '.join(COMPILE_BACKENDS)}")
            if not (isinstance(self.rtol, (int, float)) and math.isfinite(self.rtol) and self.rtol > 0):
                raise BadInput(f"--rtol {self.rtol!r}: give a positive number such as 1e-2")
            if self.dtype is not None and RunDtype.of(self.dtype).is_fp8:
                raise BadInput(f"--compile with --dtype {self.dtype}: fp8 runs are emulated by a dispatch mode "
                               "(TorchDispatchMode) that torch.compile does not trace; use --dtype bf16, fp16 or fp32 "
                               "with --compile")
            if placement is not None:
                raise BadInput("--compile with --device-map auto: dynamo does not trace accelerate's offload hooks "
                               "(AlignDevicesHook moves weights in Python hooks around each forward); drop one of them")
        if placement is not None:

            if launched():
                raise BadInput("--device-map auto under torchrun: accelerate's dispatch_model places one model across "
                               "every device of this machine, while torchrun gives each rank a device of its own; "
                               "run --device-map in one process, or torchrun without it")

    def _tracing(self) -> Any:
        """``--trace``'s options (``modes.trace_pass.TraceOptions``), or None without ``--trace``."""
        if self.trace is None:
            if self.repeat is not None or self.trace_level != "modules":
                flag = "--repeat" if self.repeat is not None else "--trace-level"
                raise BadInput(f"{flag} shapes the trace: add --trace PATH")
            return None
        from ..modes.trace_pass import TraceOptions  # lazy: torch

        if launched():
            raise BadInput("--trace under torchrun: each rank would run its own share of the inputs; trace one "
                           "process (without torchrun)")
        if self.batch and self.generate is not None:
            raise BadInput("--trace with --generate --batch: the trace is written in the capture's own pass, where the "
                           "prompts decode as one left-padded batch, not one by one; drop --batch to trace them")
        return TraceOptions(self.trace, self.trace_level, self.repeat, self.compile)
