"""Tiny quantized checkpoints for the formats' unit tests: a directory with ``model.safetensors``
(and ``config.json`` carrying a ``quantization_config``), opened as the loader opens it, the
``Context`` a format's ``detect`` reads, and ``grade.check`` of what it found."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from nan_hunter.load.checkpoint import Checkpoint, open_checkpoint
from nan_hunter.load.quant.base import Context, QuantizedWeight
from nan_hunter.load.quant.grade import check
from nan_hunter.load.quant.registry import quantization_config


def checkpoint(tmp: Path, tensors: dict, qc: dict | None = None) -> Checkpoint:
    d = tmp / "ck"
    d.mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "model.safetensors"))
    if qc is not None:
        (d / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": qc}))
    return open_checkpoint(d)


def context(ck: Checkpoint) -> Context:
    return Context(ck, quantization_config(ck), set(ck.names()))


def detect(fmt, ck: Checkpoint) -> tuple[dict[str, QuantizedWeight], Context]:
    ctx = context(ck)
    return {q.name: q for q in fmt.detect(ctx)}, ctx


def graded(fmt, ck: Checkpoint) -> dict:
    """``{name: QuantizedScan}`` of every weight ``fmt`` finds."""
    found, _ = detect(fmt, ck)
    return {name: check(ck, q) for name, q in found.items()}
