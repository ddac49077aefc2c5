"""nan_hunter/model/device.py: ``--device`` checked without building a model (exit 2, one line)."""

from __future__ import annotations

import pytest
import torch

from nan_hunter.errors import BadInput
from nan_hunter.model.device import check_device


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_auto_and_cpu_are_always_fine(device):
    check_device(device)


@pytest.mark.parametrize("device", ["tpu", "CUDA", "", "cuda:0"])
def test_other_names_are_refused(device):
    with pytest.raises(BadInput, match=r"use auto, cpu or cuda"):
        check_device(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_cuda_device_is_refused():
    with pytest.raises(BadInput, match="no CUDA device available"):
        check_device("cuda")
