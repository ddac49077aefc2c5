"""Everything a run needs, built once from the CLI's or the API's options (scan, bisect and
check share it): the checkpoint, the model and tokenizer, the batches, the ``RunDtype`` (the one
dtype rule) and the device."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..dtypes import RunDtype, name_of, parse_dtype
from ..errors import BadInput
from ..load.checkpoint import Checkpoint
from .build import build_model
from .device import check_device
from .inputs import batch_notes, build_batches
from .placement import build_placed, input_device, placement_notes

if TYPE_CHECKING:  # pragma: no cover
    from .placement import Placement

DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog."


@dataclass
class Prepared:
    """Everything a run needs, built once (scan, bisect and check share it)."""

    ck: Checkpoint
    model: Any
    tokenizer: Any
    how: str | None
    batches: list[Any]
    labels: list[str]
    run: RunDtype
    device: Any
    cfg: Config
    notes: list[str] = field(default_factory=list)
    texts: list[str | None] = field(default_factory=list)  # per input: its prompt or data line (None: a file)
    #: the quantization method of a model run in its own quantized form (not cast to the asked dtype)
    quantized: str | None = None
    #: the weights as loaded, before the cast to the run's dtype (``whole.master_of``): what a fix is
    #: checked from on a fresh copy of the whole model (bf16 from the checkpoint, not from fp16)
    master: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def dtype(self) -> str:
        return self.run.name


def checkpoint_dtype(ck: Checkpoint) -> str | None:
    counts: Counter = Counter()
    for name in ck.names():
        e = ck.entries.get(name)
        tag = e.dtype if e else None
        m = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "F64": "fp32"}.get(tag or "")
        if m is None and e is None:
            m = name_of(ck.tensor(name).dtype)
        if m in ("fp32", "fp16", "bf16"):
            counts[m] += e.numel if e else 1
    return counts.most_common(1)[0][0] if counts else None


def run_dtype(name: str, cfg: Config) -> RunDtype:
    """The one place a run's ``RunDtype`` is built: the dtype name with the configured fp8 recipe."""
    return RunDtype.of(name, cfg.fp8.recipe())


def builds_a_model(ck: Checkpoint, arch: str | None) -> bool:
    """Whether ``build.build_model`` builds a model for ``ck``: with ``--arch``, or for a Hugging Face
    directory with its ``config.json``. Otherwise the run is weights-only and torch is not needed."""
    return bool(arch) or (ck.format == "hf" and ck.config_path is not None)


def _no_model(
    inputs: list[str] | None, prompts: list[str] | None, data: str | None, need_model: bool
) -> None:
    if inputs or prompts or data:
        raise BadInput(
            "inputs were given but no model can be built: pass --arch file.py:factory "
            "(or use a Hugging Face directory with config.json)"
        )
    if need_model:
        raise BadInput("this command needs a model: pass --arch file.py:factory or a Hugging Face directory")


def prepare(
    ck: Checkpoint,
    arch: str | None,
    inputs: list[str] | None,
    prompts: list[str] | None,
    data: str | None,
    dtype: str | None,
    device: str,
    cfg: Config,
    attn: str | None = None,
    need_model: bool = False,
    placement: Placement | None = None,
) -> Prepared | None:
    """``placement`` (``--device-map auto``): the model is placed by accelerate in the run's
    compute dtype and takes its inputs on its first device; ``device`` is then not used. None when no
    model can be built (a weights-only run: decided before torch is imported)."""
    dt = parse_dtype(dtype)
    if placement is None and not builds_a_model(ck, arch):
        check_device(device)  # a bad --device is refused as when a model is built
        _no_model(inputs, prompts, data, need_model)
        return None
    from .execute import (  # lazy: torch
        cast_batch,
        cast_model,
        own_compute_dtype,
        quantized_form,
        resolve_device,
    )
    from .whole import COPY_LIMIT, master_of  # lazy: torch

    if placement is not None:
        placed = run_dtype(dt or checkpoint_dtype(ck) or "fp32", cfg)
        model, tok, how = build_placed(ck, arch, attn, placement, placed.torch_compute)
        dev = input_device(model)
    else:
        dev = resolve_device(device)
        model, tok, how = build_model(ck, arch, attn)
    if model is None:
        _no_model(inputs, prompts, data, need_model)
        return None
    notes = []
    batches = build_batches(model, tok, inputs, prompts, data)
    if not batches:
        if tok is None:
            if need_model:
                raise BadInput(
                    "no inputs: pass --inputs FILE.safetensors (or --prompt/--data with a tokenizer)"
                )
            return Prepared(
                ck,
                model,
                tok,
                how,
                [],
                [],
                run_dtype(dt or "fp32", cfg),
                dev,
                cfg,
                [
                    "model built, but no inputs given: weights-only scan "
                    "(pass --inputs, --prompt or --data to run it)"
                ],
            )
        batches = build_batches(model, tok, None, [DEFAULT_PROMPT], None)
        notes.append(f"no inputs given: ran the default prompt {DEFAULT_PROMPT!r}")
    notes += batch_notes(batches)
    run = run_dtype(dt or checkpoint_dtype(ck) or "fp32", cfg)
    quantized = quantized_form(model)
    if quantized is not None:  # packed weights cannot be cast: the run is the model's own quantized form
        own = own_compute_dtype(model)
        if own != run.name:
            notes.append(
                f"a {quantized} model runs in its own quantized form: its unquantized parts in {own}, "
                f"not cast to {run.name}"
            )
        run = run_dtype(own, cfg)
    master = None
    if placement is None:
        if quantized is None:
            master = master_of(
                model, run, COPY_LIMIT
            )  # by reference: the cast gives the parameters new tensors
        model = cast_model(model, run, dev)
    else:
        model = model.eval()
        notes += placement_notes(model)
    kw = [cast_batch(b.kwargs, run, dev) for b in batches]
    return Prepared(
        ck,
        model,
        tok,
        how,
        kw,
        [b.label for b in batches],
        run,
        dev,
        cfg,
        notes,
        [b.text for b in batches],
        quantized,
        master,
    )
