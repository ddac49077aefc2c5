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


def check_backend(backend: str, device_type: str) -> None:
    """Refuse a backend that cannot read tensors on ``device_type``: compiled Triton kernels read
    CUDA memory only; on the CPU they run only interpreted (``TRITON_INTERPRET=1`` set before
    triton is first imported, as the test suite does on machines without a GPU)."""
    if backend not in ("triton", "reference"):
        raise ValueError(f"backend must be 'triton', 'reference' or None (automatic), got {backend!r}")
    if backend == "triton" and device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"backend='triton' reads CUDA tensors, not {device_type} ones: use backend='reference' "
            "(or None) there, or set TRITON_INTERPRET=1 before triton is imported to interpret "
            "the kernels on the CPU (slow; for tests)"
        )
