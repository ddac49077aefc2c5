"""kernels/__init__.py: which statistics backend reads a tensor — Triton for CUDA tensors when it
imports, the torch reference otherwise, ``NANHUNTER_KERNEL=reference`` forcing it — and a backend
that cannot read the device refused with how to fix it."""

from __future__ import annotations

import pytest

from nan_hunter.kernels import check_backend, select_backend, triton_available


def test_reference_forced_by_the_environment(monkeypatch):
    monkeypatch.setenv("NANHUNTER_KERNEL", "Reference")
    assert triton_available() is False
    assert select_backend("cuda") == "reference"


def test_triton_when_it_imports(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("NANHUNTER_KERNEL", raising=False)
    assert triton_available() is True
    assert select_backend("cuda") == "triton"


@pytest.mark.parametrize("device", ["cpu", "mps", "meta"])
def test_everything_else_reads_with_the_reference(monkeypatch, device):
    monkeypatch.delenv("NANHUNTER_KERNEL", raising=False)
    assert select_backend(device) == "reference"


@pytest.mark.parametrize(
    "backend, device, interpret, says",
    [
        ("numpy", "cpu", None, "backend must be 'triton', 'reference' or None (automatic), got 'numpy'"),
        ("triton", "cpu", None, "backend='triton' reads CUDA tensors, not cpu ones"),
        ("triton", "cpu", "0", "set TRITON_INTERPRET=1 before triton is imported"),
    ],
)
def test_refused(monkeypatch, backend, device, interpret, says):
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        check_backend(backend, device)


@pytest.mark.parametrize(
    "backend, device, interpret",
    [
        ("reference", "cpu", None),
        ("reference", "cuda", None),
        ("triton", "cuda", None),
        ("triton", "cpu", "1"),  # interpreted: the kernel tests' way on a machine without a GPU
    ],
)
def test_accepted(monkeypatch, backend, device, interpret):
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    assert check_backend(backend, device) is None
