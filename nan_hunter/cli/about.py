"""``nanhunter --version``: one line per component a bug report needs. Libraries are imported
here only (``--help`` stays torch-free); one that is absent, or fails to import, says so."""

from __future__ import annotations

import platform
import sys
from typing import Any

from ..version import __version__

#: the libraries whose versions change what nanhunter sees, in the order a bug report reads them
LIBRARIES = ("transformers", "accelerate", "lightning", "triton", "safetensors")


def version_lines() -> list[str]:

    lines = [
        f"nanhunter     {__version__}",
        f"Python        {platform.python_version()} ({platform.python_implementation()}, {sys.platform})",
        f"torch         {_torch()}",
    ]
    lines += [f"{name:<13} {_library(name)}" for name in LIBRARIES]
    return lines


def _installed(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _library(name: str) -> str:
    """The installed version, read from the package's metadata (no import: importing transformers
    or lightning takes seconds and tells nothing more)."""
    v = _installed(name)
    if v is not None:
        return v
    if name == "lightning" and _installed("pytorch-lightning") is not None:
        return f"not installed; pytorch-lightning {_installed('pytorch-lightning')}"
    return "not installed"


def _torch() -> str:
    """torch's version, the GPU build it was compiled for (CUDA or ROCm, or CPU only) and the
    device it sees now."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - a broken install is what the report needs to show
        return (
            "not installed"
            if isinstance(e, ImportError) and _installed("torch") is None
            else f"cannot be imported ({type(e).__name__}: {e})"
        )
    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    build = f"ROCm {hip}" if hip else f"CUDA {cuda}" if cuda else "CPU only"
    return f"{torch.__version__} ({build}); device: {_device(torch)}"


def _device(torch: Any) -> str:
    try:
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            name = torch.cuda.get_device_name(0)
            cap = ".".join(map(str, torch.cuda.get_device_capability(0)))
            more = f" (+{n - 1} more)" if n > 1 else ""
            return f"{name}, compute capability {cap}{more}"
        mps = getattr(getattr(torch, "backends", None), "mps", None)
        if mps is not None and mps.is_available():
            return "Apple MPS"
    except Exception as e:  # noqa: BLE001 - a driver problem is worth reporting, not a crash
        return f"none usable ({type(e).__name__}: {e})"
    return "none (CPU)"
