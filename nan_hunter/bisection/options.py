"""What a bisect runs (``nanhunter bisect``, ``nan_hunter.bisect``): one frozen object, every option
checked once, at construction, before anything is loaded (flags in parentheses)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..dtypes import parse_dtype
from ..errors import BadInput
from ..model.inputs import one_or_many, one_path

GRANULARITIES = ("leaf", "block")
OVER = ("modules", "inputs")
KEEP_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class BisectOptions:
    """A bisect's options, validated (docs/contract.md, "bisect")."""

    checkpoint: str  # a .safetensors file, a sharded index or a model directory
    dtype: str = "fp16"  # (--dtype) the low precision that fails; canonical name after checking
    keep_dtype: str = "fp32"  # (--keep-dtype) what kept modules run in: fp32 or bf16
    arch: str | None = None  # (--arch) file.py:factory or package.module:factory
    inputs: tuple[str, ...] = ()  # (--inputs) .safetensors files of forward() keyword arguments
    prompts: tuple[str, ...] = ()  # (--prompt) texts for the checkpoint's tokenizer
    data: str | None = None  # (--data) a .jsonl file of {"text": ...}
    device: str = "auto"  # (--device) auto | cpu | cuda
    attn: str | None = None  # (--attn) transformers attn_implementation
    granularity: str | None = None  # (--granularity) leaf | block; None: the config's bisect.granularity
    over: str = "modules"  # (--over) modules: a minimal keep set; inputs: which inputs fail
    rtol: float | None = None  # (--rtol) a run passes within this relative error; None: the config's
    policy_out: str | None = None  # (--policy-out) write the policy YAML here
    generate: int | None = None  # (--generate N) judge each run by greedy decoding of N tokens per input
    backward: bool = False  # (--backward) a run also needs a finite backward of the loss
    loss: str | None = None  # (--loss file.py:fn) the loss --backward differentiates

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "inputs", one_or_many(self.inputs, "inputs"))
        set_(self, "prompts", one_or_many(self.prompts, "prompts"))  # a string is one prompt
        set_(self, "data", one_path(self.data, "data"))
        dt = parse_dtype(self.dtype) or "fp16"
        keep = parse_dtype(self.keep_dtype) or "fp32"
        if keep not in KEEP_DTYPES:
            raise BadInput(f"--keep-dtype {self.keep_dtype}: use fp32 or bf16")
        if dt == "fp32" or dt == keep:
            raise BadInput(f"--dtype {self.dtype}: nothing to bisect — the run is already in {dt}, the precision "
                           f"modules would be kept in; pass the low precision to fix, e.g. --dtype fp16")
        set_(self, "dtype", dt)
        set_(self, "keep_dtype", keep)
        if self.granularity is not None and self.granularity not in GRANULARITIES:
            raise BadInput(f"--granularity {self.granularity}: use leaf or block")
        if self.over not in OVER:
            raise BadInput(f"--over {self.over}: use modules or inputs")
        if self.rtol is not None and not (isinstance(self.rtol, (int, float)) and not isinstance(self.rtol, bool)
                                          and math.isfinite(self.rtol) and self.rtol > 0):
            raise BadInput(f"--rtol {self.rtol!r}: give a positive number such as 1e-2")
        if self.generate is not None and (isinstance(self.generate, bool) or not isinstance(self.generate, int)
                                          or self.generate < 1):
            raise BadInput(f"--generate {self.generate!r}: give the number of new tokens to decode, e.g. --generate 16")
        if self.loss is not None and not self.backward:
            raise BadInput("--loss is the loss --backward differentiates: add --backward")
        if self.backward and self.generate is not None:
            raise BadInput("bisect --backward with --generate: transformers' generate() runs under torch.no_grad(), "
                           "so a decoding has no backward; run them separately")

    def resolved(self, cfg: Any) -> tuple[str, float]:
        """(granularity, rtol): the options', else the configuration's ``bisect`` defaults."""
        return self.granularity or cfg.bisect.granularity, float(self.rtol if self.rtol is not None else cfg.bisect.rtol)
