"""Tensor statistics backends: ``reference`` (torch) and ``triton`` (fused GPU kernel).

``select_backend(device)`` picks Triton for CUDA tensors when triton imports, the torch
reference otherwise; ``NANHUNTER_KERNEL=reference`` forces the reference.
"""

from __future__ import annotations

import os


def triton_available() -> bool:
    if os.environ.get("NANHUNTER_KERNEL", "").lower() == "reference":
        return False
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def select_backend(device_type: str) -> str:
    if device_type == "cuda" and triton_available():
        return "triton"
    return "reference"
