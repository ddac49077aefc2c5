"""nan_hunter/load/quant/registry.py: a layout that names a known format but breaks its arithmetic is
listed in ``weights.unchecked`` with the reason, never an internal error, whichever exception numpy
raises for it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.quant.fp8 import Fp8
from nan_hunter.load.weights import scan_weights


@pytest.mark.parametrize("error", [ValueError, IndexError, TypeError, RuntimeError])
def test_a_format_that_raises_is_listed_unchecked(tmp_path, monkeypatch, error):
    save_file(
        {"l.weight": torch.ones(4, 4).to(torch.float8_e4m3fn), "l.weight_scale_inv": torch.ones(1, 1)},
        str(tmp_path / "w.safetensors"),
    )

    def broken(self, ck, q):
        raise error("operands do not fit")

    monkeypatch.setattr(Fp8, "blocks", broken)
    ws = scan_weights(open_checkpoint(tmp_path / "w.safetensors"))
    assert ws.quantized == []
    assert ws.unchecked == [
        {
            "name": "l.weight",
            "dtype": "fp8_tensor",
            "reason": f"does not fit the fp8_tensor layout ({error.__name__}: operands do not fit)",
        }
    ]
