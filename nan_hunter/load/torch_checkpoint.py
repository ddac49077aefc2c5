"""``.pt``/``.bin``/``.ckpt`` files: ``torch.load(weights_only=True)`` only, never plain unpickling.

Zip-format files (torch >= 1.6) are memory-mapped by torch; legacy non-zip files cannot be, and
are read whole, still with ``weights_only=True``. A training checkpoint nests its tensors
(``{'model': {...}, 'optimizer': {'state': {0: {'exp_avg': ...}}}, 'epoch': 3}``): every tensor
found is named by its dotted path (``model.fc.weight``, ``optimizer.state.0.exp_avg_sq``), so a
NaN in the optimizer state or an EMA copy is scanned and named like any weight.
"""

from __future__ import annotations

import re
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInput
from .regular_file import require_regular

if TYPE_CHECKING:  # pragma: no cover
    import torch

MAX_NESTING = 64
MAX_TENSORS = 1_000_000


def tensors_by_path(obj: Any, where: str) -> dict[str, torch.Tensor]:
    """Every tensor inside nested dicts, lists and tuples of ``obj``, keyed by its dotted path."""
    import torch

    out: dict[str, torch.Tensor] = {}
    stack: list[tuple[str, Any, int]] = [("", obj, 0)]
    while stack:
        path, x, depth = stack.pop()
        if isinstance(x, torch.Tensor):
            if path in out:
                raise BadInput(
                    f"{where}: two tensors are both named {path!r} by their path; "
                    "save the state dicts under distinct keys"
                )
            if len(out) >= MAX_TENSORS:
                raise BadInput(f"{where}: more than {MAX_TENSORS:,} tensors, nanhunter's limit")
            out[path] = x
            continue
        if isinstance(x, dict):
            items = [(str(k), v) for k, v in x.items()]
        elif isinstance(x, (list, tuple)):
            items = [(str(i), v) for i, v in enumerate(x)]
        else:
            continue  # epoch counters, hyper-parameters, strings: not tensors
        if depth >= MAX_NESTING:
            raise BadInput(f"{where}: containers nested deeper than {MAX_NESTING} levels")
        for k, v in reversed(items):  # reversed onto a stack: tensors come out in saved order
            stack.append((f"{path}.{k}" if path else k, v, depth + 1))
    return out


def _reason(e: Exception) -> str:
    """The informative part of torch.load's error (its first line is boilerplate for refusals)."""
    text = str(e).strip()
    m = re.search(r"WeightsUnpickler error: ([^\n]*)", text)
    line = m.group(1) if m else (text.splitlines()[0] if text else type(e).__name__)
    return line[:200] + ("…" if len(line) > 200 else "")


def load_torch_file(path: Path, real: Path | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a torch checkpoint by dotted path; exit 2 for anything weights_only refuses."""
    import torch

    src = real or path
    require_regular(src, "checkpoint")
    try:
        is_zip = zipfile.is_zipfile(src)
    except OSError as e:
        raise BadInput(f"{path}: cannot read it ({e.strerror})") from None
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the refusal below says it all
            warnings.simplefilter("ignore")
            # mmap works for the zip format only; legacy (pre-1.6) files are read whole
            obj = torch.load(src, map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as e:  # weights_only refusals, corrupt archives, out of memory
        raise BadInput(
            f"{path}: cannot be loaded with torch.load(weights_only=True) ({_reason(e)}); "
            "nanhunter never unpickles arbitrary code: convert it to safetensors"
        ) from None
    if isinstance(obj, torch.Tensor):
        return {"tensor": obj}
    if not isinstance(obj, (dict, list, tuple)):
        raise BadInput(
            f"{path}: expected a state dict (mapping of names to tensors), got {type(obj).__name__}"
        )
    found = tensors_by_path(obj, str(path))
    if not found:
        raise BadInput(f"{path}: holds no tensors (expected a state dict)")
    return found
