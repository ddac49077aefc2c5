"""The option groups every model-running command shares, defined once: what the model is built from
(``--arch``, ``--attn``), what it is fed (``--inputs``, ``--prompt``, ``--data``), where it runs
(``--device``), and the decoding and backward modes ``scan``, ``check`` and ``bisect`` take
alike. ``ScanOptions``, ``CheckOptions`` and ``BisectOptions`` are made of these groups; each
group checks its own fields (``check_loading``, ``check_loss``, ``check_decoding``), with the same refusal for every
command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BadInput
from ..options import Panel, option
from .inputs import one_or_many, one_path


@dataclass(frozen=True, kw_only=True)
class LoadOptions:
    """What the model is built from, what it is fed, where it runs."""

    arch: str | None = option(
        None,
        "--arch",
        metavar="FILE.py:FACTORY",
        panel=Panel.MODEL,
        help="the model: path/to/file.py:factory or package.module:factory; factory() returns the nn.Module "
        "the weights load into (default: config.json of a model directory)",
    )
    attn: str | None = option(
        None,
        "--attn",
        metavar="eager|sdpa",
        panel=Panel.MODEL,
        help="transformers attn_implementation (default: the model's own)",
    )
    inputs: tuple[str, ...] = option(
        (),
        "--inputs",
        metavar="FILE",
        panel=Panel.INPUTS,
        repeatable=True,
        help="a .safetensors of forward() kwargs (repeatable)",
    )
    prompts: tuple[str, ...] = option(
        (),
        "--prompt",
        metavar="TEXT",
        panel=Panel.INPUTS,
        repeatable=True,
        param="prompt",
        help="text to tokenize (repeatable)",
    )
    data: str | None = option(
        None,
        "--data",
        metavar="FILE.jsonl",
        panel=Panel.INPUTS,
        help='a .jsonl file with {"text": ...} per line',
    )
    device: str = option(
        "auto",
        "--device",
        metavar="auto|cpu|cuda",
        panel=Panel.RUN,
        help="where the model runs (auto: cuda when available)",
    )

    def check_loading(self) -> None:
        """Repeatable options as tuples (a string is one item), ``data`` one path."""
        set_ = object.__setattr__
        set_(self, "inputs", one_or_many(self.inputs, "inputs"))
        set_(self, "prompts", one_or_many(self.prompts, "prompts"))  # a string is one prompt
        set_(self, "data", one_path(self.data, "data"))

    @property
    def has_inputs(self) -> bool:
        return bool(self.inputs or self.prompts or self.data)


@dataclass(frozen=True, kw_only=True)
class BackwardOptions:
    """``--backward`` and the ``--loss`` it differentiates (``scan`` and ``bisect``)."""

    backward: bool = option(
        False,
        "--backward",
        panel=Panel.MODE,
        help="forward then backward of a loss for each input; the backward is captured too",
    )
    loss: str | None = option(
        None,
        "--loss",
        metavar="FILE.py:FN",
        panel=Panel.MODE,
        help="--backward: fn(outputs, batch) -> scalar tensor (default: a causal LM's own loss, labels = input_ids)",
    )

    def check_loss(self) -> None:
        if self.loss is not None and not self.backward:
            raise BadInput("--loss is the loss --backward differentiates: add --backward")


def check_generate(n: Any) -> None:
    """``--generate N``: a whole number of new tokens, at least 1."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise BadInput(f"--generate {n!r}: give the number of new tokens to decode, e.g. --generate 16")


@dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """``--generate N`` and ``--batch`` (``scan`` and ``check``)."""

    generate: int | None = option(
        None,
        "--generate",
        metavar="N",
        panel=Panel.MODE,
        number=int,
        help="greedy decoding of up to N new tokens per input through the model's generate(), every step "
        "captured; stops at the first non-finite value",
    )
    batch: bool = option(
        False,
        "--batch",
        panel=Panel.MODE,
        help="--generate: decode all inputs together as one left-padded batch",
    )

    def check_decoding(self) -> None:
        check_generate(self.generate)
        if self.batch and self.generate is None:
            raise BadInput("--batch decodes the inputs together: it needs --generate N")
