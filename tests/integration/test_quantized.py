"""Quantized and tensor-subclass weights never break the user's forward or report().

Real torchao (``quantize_(model, Float8WeightOnlyConfig())``: weights become ``Float8Tensor``,
whose dispatch implements few ops — ``aten.aminmax`` raised NotImplementedError inside the
user's forward at level modules, and inside report() at level blocks), and a small wrapper
subclass of our own that behaves the same way, so the path is tested without torchao too.
Subclasses are measured through their values (``dequantize()``, or data × scale from
``__tensor_flatten__``), so a NaN in a quantised weight's scale is still found.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_map

import nan_hunter

LEVELS = ["blocks", "modules", "ops"]


class Net(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def _float8_model() -> Net:
    pytest.importorskip("torchao")
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = Net().to(torch.bfloat16).eval()
    quantize_(model, Float8WeightOnlyConfig())
    assert type(model.layers[0][0].weight).__name__ == "Float8Tensor"
    return model


@pytest.mark.parametrize("level", LEVELS)
def test_torchao_float8_weights_under_every_level(level):
    model = _float8_model()
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        plain = model(x)
        with nan_hunter.watch(model, level=level) as w:
            watched = model(x)
    assert torch.equal(plain, watched)
    r = w.report()
    assert r.first_nonfinite is None and r.failed_inputs == []


@pytest.mark.parametrize("level", LEVELS)
def test_nan_in_a_torchao_scale_is_found_as_weights(level):
    """A NaN in one row's fp8 scale: the dequantised weight row is NaN, and the report blames the
    weights of the Linear that owns it."""
    model = _float8_model()
    w8 = model.layers[1][0].weight
    names, _ = w8.__tensor_flatten__()
    assert names == ["qdata", "scale"]
    with torch.no_grad():
        w8.scale[3] = float("nan")
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.no_grad(), nan_hunter.watch(model, level=level) as w:
        model(x)
    f = w.report().first_nonfinite
    assert (f.module, f.role, f.kind, f.tensor) == ("layers.1.0", "weights", "nan", "weight")


aten = torch.ops.aten


class Opaque(torch.Tensor):
    """A wrapper subclass holding fp8 data and a per-row scale, like torchao's Float8Tensor: any op
    runs on the dequantised values, except the reductions it does not implement (aminmax)."""

    @staticmethod
    def __new__(cls, qdata: torch.Tensor, scale: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=torch.float32, device=qdata.device)

    def __init__(self, qdata: torch.Tensor, scale: torch.Tensor):
        self.qdata = qdata
        self.scale = scale

    def __tensor_flatten__(self):
        return ["qdata", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return Opaque(inner["qdata"], inner["scale"])

    def __repr__(self):
        return f"Opaque({tuple(self.shape)})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in (aten.aminmax.default, aten.max.default, aten.min.default):
            raise NotImplementedError(f"Opaque dispatch: attempting to run unimplemented operator {func}")
        if func is aten.detach.default:
            return Opaque(args[0].qdata, args[0].scale)
        unwrap = lambda x: x.qdata.float() * x.scale if isinstance(x, Opaque) else x  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Opaque:
        scale = w.abs().amax(dim=1, keepdim=True) / 448.0
        return cls((w / scale).to(torch.float8_e4m3fn), scale)


def _opaque_model() -> Net:
    torch.manual_seed(0)
    model = Net(8).eval()
    for lin in [m for m in model.modules() if isinstance(m, nn.Linear)]:
        lin.weight = nn.Parameter(Opaque.quantize(lin.weight.detach()), requires_grad=False)
    with pytest.raises(NotImplementedError):
        torch.aminmax(model.head.weight)  # what the statistics used to call on it
    return model


@pytest.mark.parametrize("level", LEVELS)
def test_own_subclass_weights_under_every_level(level):
    model = _opaque_model()
    x = torch.randn(4, 8)
    with torch.no_grad():
        plain = model(x)
        with nan_hunter.watch(model, level=level) as w:
            watched = model(x)
    assert torch.equal(plain, watched)
    assert w.report().first_nonfinite is None


@pytest.mark.parametrize("level", LEVELS)
def test_own_subclass_nan_scale_is_found_as_weights(level):
    model = _opaque_model()
    with torch.no_grad():
        model.layers[2][0].weight.scale[1] = float("nan")
    with torch.no_grad(), nan_hunter.watch(model, level=level) as w:
        model(torch.randn(4, 8))
    f = w.report().first_nonfinite
    assert (f.module, f.role, f.kind) == ("layers.2.0", "weights", "nan")


class Unreadable(torch.Tensor):
    """A subclass with neither dequantize() nor __tensor_flatten__: it is skipped with a note."""

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data: torch.Tensor):
        self.inner = data

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in (aten.aminmax.default, aten.dequantize.self):
            raise NotImplementedError(func)
        if func is aten.detach.default:
            return Unreadable(args[0].inner)
        unwrap = lambda x: x.inner if isinstance(x, Unreadable) else x  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


def test_unreadable_subclass_is_skipped_with_a_note_never_raised():
    lin = nn.Linear(4, 4)
    lin.weight = nn.Parameter(Unreadable(lin.weight.detach().clone()), requires_grad=False)
    with torch.no_grad(), nan_hunter.watch(lin, level="modules") as w:
        out = lin(torch.randn(2, 4))
    assert torch.isfinite(out).all()
    assert any("Unreadable" in why for _, why in w.sink.unmeasured)
    r = w.report()
    assert r.first_nonfinite is None
    assert any("could not be read and were skipped" in n and "Unreadable" in n for n in r.notes)
