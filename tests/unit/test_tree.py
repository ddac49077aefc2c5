"""nan_hunter/tree.py: the walker over what modules take and return."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import torch
from torch import nn

from nan_hunter.tree import MAX_DEPTH, cast_floats, detached_copy, float_tensors, map_tensors

Pair = namedtuple("Pair", "a b")


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    hidden: tuple | None = None


class Cache:
    """A plain stateful object holding tensors in its attributes (like a KV cache)."""

    def __init__(self, t: torch.Tensor):
        self.layers = [t]


def test_float_tensors_labels_every_float_tensor_and_skips_the_rest():
    a, b, c = torch.ones(2), torch.zeros(3), torch.full((1,), 2.0)
    obj = {"x": a, "ids": torch.arange(3), "pair": Pair(b, None), "out": Out(c, hidden=(a,)), "s": "text"}
    got = [(label, t) for label, t in float_tensors(obj)]
    assert [label for label, _ in got] == ["x", "pair[0]", "out.logits", "out.hidden[0]"]
    assert got[0][1] is a and got[1][1] is b and got[2][1] is c and got[3][1] is a


def test_float_tensors_of_a_bare_tensor_and_prefix():
    t = torch.ones(1)
    assert float_tensors(t) == [("out", t)]
    assert [lbl for lbl, _ in float_tensors((t, t), "args")] == ["args[0]", "args[1]"]
    assert float_tensors(torch.ones(2, dtype=torch.int64)) == []
    assert float_tensors(torch.empty(2, device="meta")) == []


def test_float_tensors_stops_at_max_depth_on_a_cycle():
    t = torch.ones(1)
    cyc: list = [t]
    cyc.append(cyc)  # a list holding itself
    got = float_tensors(cyc)
    assert len(got) == MAX_DEPTH + 1  # one per list walked (depths 0..MAX_DEPTH), then the bound ends it
    deep = t
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    assert float_tensors(deep) == []


def test_map_tensors_rebuilds_without_mutating_and_keeps_types():
    t = torch.ones(2)
    obj = {"pair": Pair(t, 3), "lst": [t, "s"], "tup": (t,), "mod": nn.Identity()}
    out = map_tensors(obj, lambda x: x * 2)
    assert type(out["pair"]) is Pair and out["pair"].b == 3
    assert torch.equal(out["pair"].a, torch.full((2,), 2.0))
    assert out["lst"][1] == "s" and isinstance(out["tup"], tuple)
    assert out["mod"] is obj["mod"]  # modules are leaves, kept as they are
    assert torch.equal(obj["pair"].a, torch.ones(2))  # the input is untouched
    # a tensor given twice is mapped once: the aliasing is kept
    assert out["pair"].a is out["lst"][0] is out["tup"][0]


def test_map_tensors_copies_stateful_objects_instead_of_changing_them():
    t = torch.ones(2)
    cache = Cache(t)
    new = map_tensors({"cache": cache}, lambda x: x + 1)["cache"]
    assert new is not cache and cache.layers[0] is t
    assert torch.equal(new.layers[0], torch.full((2,), 2.0))
    new.layers.append(torch.zeros(1))  # growing the copy leaves the user's object alone
    assert len(cache.layers) == 1


def test_cast_floats_casts_floats_only_and_moves_every_tensor():
    obj = (torch.ones(2, dtype=torch.float32), torch.arange(2))
    f, i = cast_floats(obj, torch.float16, torch.device("cpu"))
    assert f.dtype == torch.float16 and i.dtype == torch.int64


def test_detached_copy_is_independent_and_keeps_aliasing():
    w = torch.ones(2, requires_grad=True)
    x = w * 2
    q, k = detached_copy((x, x))
    assert q is k and not q.requires_grad
    q.add_(1)
    assert torch.equal(x, torch.full((2,), 2.0))  # the original is untouched
