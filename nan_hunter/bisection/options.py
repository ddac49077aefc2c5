"""What a bisect runs (``nanhunter bisect``, ``nan_hunter.bisect``): one frozen object made of option
groups (the shared loading and backward groups of ``model/options.py``, bisect's own precision and
search below), every option checked once, at construction, before anything is loaded. Each field
carries its flag: the typer parameters are generated from them (``cli/options.command``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..dtypes import parse_dtype
from ..errors import BadInput
from ..model.options import BackwardOptions, LoadOptions, check_generate
from ..options import Granularity, KeepDtype, Over, Panel, choice, choices, option

OVER = tuple(m.value for m in Over)
KEEP_DTYPES = tuple(m.value for m in KeepDtype)


@dataclass(frozen=True, kw_only=True)
class BisectPrecision:
    """The precision that fails, and the one kept modules run in."""

    dtype: str = option(
        "fp16",
        "--dtype",
        metavar="fp16|bf16|fp8-e4m3|fp8-e5m2",
        panel=Panel.RUN,
        help="the low precision that fails",
    )
    keep_dtype: str = option(
        KeepDtype.FP32.value,
        "--keep-dtype",
        metavar=choices(KeepDtype),
        panel=Panel.RUN,
        help="the precision kept modules run in",
    )

    def check_precision(self) -> None:
        dt = parse_dtype(self.dtype) or "fp16"
        keep = choice(
            KeepDtype,
            parse_dtype(self.keep_dtype) or "fp32",
            f"--keep-dtype {self.keep_dtype}: use fp32 or bf16",
        )
        if dt == "fp32" or dt == keep:
            raise BadInput(
                f"--dtype {self.dtype}: nothing to bisect — the run is already in {dt}, the precision "
                f"modules would be kept in; pass the low precision to fix, e.g. --dtype fp16"
            )
        object.__setattr__(self, "dtype", dt)
        object.__setattr__(self, "keep_dtype", keep)


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """What the bisection searches over and how a trial run is judged."""

    granularity: str | None = option(
        None,
        "--granularity",
        metavar=choices(Granularity),
        panel=Panel.MODE,
        help="candidates: leaf modules, or whole transformer blocks (default: leaf)",
    )
    over: str = option(
        Over.MODULES.value,
        "--over",
        metavar=choices(Over),
        panel=Panel.MODE,
        help="modules: a minimal keep set; inputs: which inputs of the data set fail",
    )
    rtol: float | None = option(
        None,
        "--rtol",
        metavar="FLOAT",
        panel=Panel.MODE,
        number=float,
        help="a run passes when its outputs are within this of the run all in --keep-dtype "
        "(default: bisect.rtol in the config)",
    )
    generate: int | None = option(
        None,
        "--generate",
        metavar="N",
        panel=Panel.MODE,
        number=int,
        help="judge each run by greedy decoding of N tokens per input instead of one forward",
    )

    def check_search(self) -> None:
        set_ = object.__setattr__
        set_(
            self,
            "granularity",
            choice(Granularity, self.granularity, f"--granularity {self.granularity}: use leaf or block"),
        )
        set_(self, "over", choice(Over, self.over, f"--over {self.over}: use modules or inputs"))
        if self.rtol is not None and not (
            isinstance(self.rtol, (int, float))
            and not isinstance(self.rtol, bool)
            and math.isfinite(self.rtol)
            and self.rtol > 0
        ):
            raise BadInput(f"--rtol {self.rtol!r}: give a positive number such as 1e-2")
        check_generate(self.generate)


@dataclass(frozen=True)
class BisectOptions(BackwardOptions, SearchOptions, LoadOptions, BisectPrecision):
    """A bisect's options, validated (docs/contract.md, "bisect")."""

    checkpoint: str  # a .safetensors file, a sharded index or a model directory
    policy_out: str | None = option(
        None,
        "--policy-out",
        metavar="PATH.yaml",
        panel=Panel.OUTPUT,
        help="write the policy YAML here ('-' for stdout); apply it with nan_hunter.apply_policy",
    )

    def __post_init__(self) -> None:
        self.check_loading()
        self.check_precision()
        self.check_search()
        self.check_loss()
        if self.backward and self.generate is not None:
            raise BadInput(
                "bisect --backward with --generate: transformers' generate() runs under torch.no_grad(), "
                "so a decoding has no backward; run them separately"
            )

    def resolved(self, cfg: Any) -> tuple[str, float]:
        """(granularity, rtol): the options', else the configuration's ``bisect`` defaults."""
        return self.granularity or cfg.bisect.granularity, float(
            self.rtol if self.rtol is not None else cfg.bisect.rtol
        )
