"""``capture.floats`` finds the same tensors, with the same labels, in the same order as the one
walker, ``tree.float_tensors``, on every shape a hook meets."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, namedtuple

import pytest
import torch

from nan_hunter.capture.floats import call_items, float_items, output_tensors
from nan_hunter.tree import MAX_DEPTH, float_tensors

Pair = namedtuple("Pair", "a b")


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    extra: tuple = ()
    note: str = "x"


class Output(OrderedDict):  # what transformers' ModelOutput is: a dict subclass (and a dataclass)
    pass


class Opaque:  # not a container: never looked into
    def __init__(self) -> None:
        self.t = torch.ones(2)


def _nested(depth: int):
    x = torch.ones(1)
    for _ in range(depth):
        x = [x]
    return x


f32, f16 = torch.ones(3), torch.zeros(2, dtype=torch.float16)
ints, meta = torch.arange(3), torch.empty(2, device="meta")
param = torch.nn.Parameter(torch.ones(2))
CASES = [
    ("one tensor", f32),
    ("integer tensor", ints),
    ("meta tensor", meta),
    ("parameter", param),
    ("None and numbers", (None, 1, 2.0, True, "s", torch.float32)),
    ("tuple", (f32, ints, f16)),
    ("list in dict", {"a": [f32, None, f16], "b": ints}),
    ("empty key", {"": f32}),
    ("named tuple", Pair(f32, (f16,))),
    ("dict subclass", Output(logits=f32, past=[(f16, f16)])),
    ("dataclass", Out(f32, (f16, ints))),
    ("opaque object", Opaque()),
    ("module", torch.nn.Linear(2, 2)),
    ("at the depth limit", _nested(MAX_DEPTH)),
    ("past the depth limit", _nested(MAX_DEPTH + 2)),
    ("subclass of a tensor", torch.ones(2).as_subclass(type("Sub", (torch.Tensor,), {}))),
]


@pytest.mark.parametrize("name,obj", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("prefix", ["", "args"])
def test_float_items_is_float_tensors(name, obj, prefix):
    want = float_tensors(obj, prefix)
    got = float_items(obj, prefix)
    assert [label for label, _ in got] == [label for label, _ in want]
    assert all(a is b for (_, a), (_, b) in zip(got, want))


def test_call_items_is_args_then_kwargs():
    args = (f32, None, [f16, ints], Pair(f32, f16)) + tuple(torch.ones(1) for _ in range(17))
    kwargs = {"mask": f16, "": f32, "cache": Output(k=f32), "flag": True}
    want = float_tensors(args, "args") + float_tensors(kwargs)
    got = call_items(args, kwargs)
    assert [label for label, _ in got] == [label for label, _ in want]
    assert all(a is b for (_, a), (_, b) in zip(got, want))


def test_sentinel_output_tensors_are_float_items_tensors() -> None:
    """The sentinel's label-free walk of a root's outputs finds exactly ``float_items``' tensors, in
    order, on the shapes models return (a transformers ``ModelOutput`` with a KV cache included)."""
    from transformers import DynamicCache
    from transformers.modeling_outputs import CausalLMOutputWithPast

    f, i = torch.ones(2, 3), torch.ones(2, dtype=torch.long)
    p = torch.nn.Parameter(torch.zeros(3))
    cases = [
        f,
        i,
        p,
        (f, None, i, [f * 2, {"a": f * 3}]),
        [p, 1, "x"],
        {"x": f, "y": (f, p)},
        CausalLMOutputWithPast(logits=f, past_key_values=DynamicCache()),
        None,
        3,
        (torch.empty(0, 4), f),  # an empty batch: found like any tensor (the sentinel skips judging it)
        torch.empty(2, device="meta"),
    ]
    for out in cases:
        got, want = output_tensors(out), [t for _, t in float_items(out)]
        assert len(got) == len(want) and all(a is b for a, b in zip(got, want)), out
