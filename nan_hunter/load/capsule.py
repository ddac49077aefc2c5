"""The capsule: a failing training step, written at the fault, replayable on another machine.

``DIR/step-<k>/`` holds, as safetensors and JSON only (nothing is pickled):

- ``model.safetensors``: parameters and persistent buffers as at the start of step k, by
  ``state_dict()`` name;
- ``inputs.safetensors``: that step's batch: keyword tensors by name, positional ones as
  ``args.<i>``; non-tensor arguments are listed in ``capsule.json`` (``inputs.other``) when they
  are JSON values, else dropped with a note;
- ``grad_outputs.safetensors`` (backward and optimizer faults): the gradients that reached the
  model's outputs in that step, by output label (``logits``, ``loss``): the backward re-runs from
  them, so the user's loss function is not needed;
- ``optimizer.safetensors`` (optimizer faults): each parameter's gradient (``grad/<name>``) and
  optimizer state (``state/<name>/<key>``) as they were before the failing ``optimizer.step()``;
- ``capsule.json``: ``schema`` (``nanhunter.capsule/v1``), how to rebuild the model (``config``:
  the HF config as a dict, with ``model_class``; or ``arch``: ``file.py:factory``), ``dtype``,
  ``autocast``, ``training`` mode, ``phase``, ``step``, ``loss``, ``optimizer`` (class and
  hyperparameters), ``versions``.

Writes go through ``outputs.write_bytes`` (temporary file, fsync, rename) into a fresh directory;
an existing ``step-<k>`` is never overwritten.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..outputs import write_bytes, write_text
from .bounded_json import loads
from .regular_file import read_regular

SCHEMA = "nanhunter.capsule/v1"
MAX_JSON = 16 << 20


def _tensors_bytes(tensors: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    out: dict[str, Any] = {}
    storages: set[int] = set()
    for k, v in tensors.items():
        t = v.detach().contiguous().cpu()
        ptr = t.untyped_storage().data_ptr()
        if ptr in storages:  # safetensors refuses tensors sharing memory (labels = input_ids): a copy each
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        out[k] = t
    return save(out)


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


def write(
    root: str | os.PathLike[str],
    step: int,
    *,
    weights: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    meta: dict[str, Any],
    grad_outputs: list[tuple[str, Any]] | None = None,
    optimizer: dict[str, Any] | None = None,
) -> Path:
    """Write ``root/step-<step>/``; returns its path. ``meta`` goes into capsule.json (phase, dtype,
    autocast, config or arch, ...); ``optimizer``: {"grads": {name: t}, "state": {name: {key: t}},
    "class": str, "hyperparameters": [per group], "groups": {name: group index}}."""
    import torch

    out = Path(root) / f"step-{step}"
    inputs: dict[str, Any] = {}
    other: dict[str, Any] = {}
    dropped: list[str] = []
    named = [(f"args.{i}", a) for i, a in enumerate(args)] + list(kwargs.items())  # positional as args.<i>
    for key, v in named:
        if isinstance(v, torch.Tensor):
            inputs[key] = v
        elif _jsonable(v):
            other[key] = v
        else:
            dropped.append(key)
    # Everything is serialized before the directory exists (a tensor safetensors cannot store
    # leaves no half capsule), and capsule.json, which makes it a capsule, is written last.
    blobs = {"model.safetensors": _tensors_bytes(weights), "inputs.safetensors": _tensors_bytes(inputs)}
    if grad_outputs:
        blobs["grad_outputs.safetensors"] = _tensors_bytes(dict(grad_outputs))
    info = dict(meta)
    if optimizer is not None:
        flat = {f"grad/{n}": g for n, g in optimizer["grads"].items()}
        for n, st in optimizer["state"].items():
            for k, v in st.items():
                flat[f"state/{n}/{k}"] = v
        blobs["optimizer.safetensors"] = _tensors_bytes(flat)
        info["optimizer"] = {k: v for k, v in optimizer.items() if k not in ("grads", "state")}
    info.update(
        {
            "schema": SCHEMA,
            "step": step,
            "files": list(blobs),
            "inputs": {"tensors": sorted(inputs), "other": other, "dropped": dropped},
        }
    )
    text = json.dumps(info, indent=2, allow_nan=False) + "\n"
    out.mkdir(parents=True, exist_ok=False)
    for name, data in blobs.items():
        write_bytes("capsule", str(out / name), data)
    write_text("capsule", str(out / "capsule.json"), text)
    return out


@dataclass
class Capsule:
    """A capsule directory, validated: what ``nanhunter scan DIR/step-<k>`` rebuilds and re-runs."""

    path: Path
    meta: dict[str, Any]
    files: list[str] = field(default_factory=list)

    @property
    def phase(self) -> str:
        phase: str = self.meta.get("phase", "forward")
        return phase

    @property
    def step(self) -> int:
        return int(self.meta.get("step", 0))


def is_capsule(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "capsule.json").is_file()


def read(path: str | os.PathLike[str], arch_given: bool = False) -> Capsule:
    """Read and validate ``capsule.json`` (bounded, strict JSON); bad content is ``BadInput``.
    ``arch_given``: the caller builds the model itself (``--arch``), so the capsule need not say how."""

    p = Path(path)
    meta = loads(read_regular(p / "capsule.json", "capsule.json", MAX_JSON), str(p / "capsule.json"))
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        raise BadInput(
            f"{p / 'capsule.json'}: not a nanhunter capsule (schema {SCHEMA!r} expected); "
            "give the step-<k> directory that watch(capsule_dir=...) wrote"
        )
    if meta.get("phase") not in ("forward", "backward", "optimizer"):
        raise BadInput(
            f"{p / 'capsule.json'}: phase {meta.get('phase')!r} is not forward, backward or optimizer"
        )
    if not isinstance(meta.get("step"), int) or meta["step"] < 0:
        raise BadInput(f"{p / 'capsule.json'}: step must be a non-negative integer")
    if not arch_given and not isinstance(meta.get("config"), dict) and not isinstance(meta.get("arch"), str):
        raise BadInput(
            f"{p}: the capsule says neither how to build the model (config) nor an arch; write it with "
            "watch(..., capsule_dir=DIR, arch='file.py:factory') for a model that is not a transformers one"
        )
    files = [f for f in meta.get("files", []) if isinstance(f, str)]
    for f in files:
        if "/" in f or "\\" in f or f.startswith(".") or not (p / f).is_file():
            raise BadInput(f"{p}: capsule file {f!r} is missing or not a plain name inside the capsule")
    return Capsule(p, meta, files)
