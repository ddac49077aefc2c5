"""``--device`` checked without building anything (a weights-only run never loads torch for it)."""

from __future__ import annotations

from ..errors import BadInput

DEVICES = ("auto", "cpu", "cuda")


def check_device(device: str) -> None:
    """Exit 2 (BadInput) for a name other than auto, cpu or cuda, or for cuda on a machine without it
    (torch is imported only to answer that)."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BadInput("--device cuda: no CUDA device available; use --device cpu or auto")
    if device not in DEVICES:
        raise BadInput(f"--device {device!r}: use auto, cpu or cuda")
