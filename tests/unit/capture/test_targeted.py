"""nan_hunter/capture/targeted.py: one-call re-runs (inputs of a call, a backward region, the
calls of a module's children, first-call order, batch rows holding faults)."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from nan_hunter.capture.snapshot import Snapshot
from nan_hunter.capture.targeted import (
    backward_region,
    call_inputs,
    child_calls,
    first_call_order,
    rows_holding_faults,
)

HERE = Path(__file__).name


class Twice(nn.Module):
    """Calls one shared Linear twice, the second time on a kwarg-free, doubled input."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.head = nn.Linear(2, 1)

    def forward(self, x):
        h = self.lin(x)
        h = self.lin(h * 2)
        return self.head(h)


class KwTarget(nn.Module):
    def forward(self, x, *, scale):
        return x * scale


class WithKw(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = KwTarget()

    def forward(self, x):
        return self.inner(x + 1, scale=torch.full((1,), 3.0))


def hookless(m: nn.Module) -> bool:
    return all(not s._forward_pre_hooks and not s._forward_hooks for s in m.modules())


# --- call_inputs --------------------------------------------------------------------------------


def test_call_inputs_of_the_second_call_of_a_shared_module_and_its_call_sites():
    torch.manual_seed(0)
    m = Twice()
    x = torch.ones(1, 2)
    sites: list[str | None] = []
    args, kwargs = call_inputs(m, lambda: m(x), "lin", 1, sites=sites)
    assert torch.allclose(args[0], m.lin(x).detach() * 2) and kwargs == {}
    # one site per call reached: both calls, each naming this file's line in Twice.forward
    assert len(sites) == 2
    assert sites[0] is not None and HERE in sites[0] and "h = self.lin(x)" in sites[0]
    assert sites[1] is not None and HERE in sites[1] and "h = self.lin(h * 2)" in sites[1]
    assert hookless(m)


def test_call_inputs_copies_keyword_arguments_detached_and_independent():
    m = WithKw()
    x = torch.ones(2, requires_grad=True)
    args, kwargs = call_inputs(m, lambda: m(x), "inner", 0)
    assert torch.equal(args[0], torch.full((2,), 2.0)) and not args[0].requires_grad
    assert set(kwargs) == {"scale"} and torch.equal(kwargs["scale"], torch.full((1,), 3.0))
    args[0].add_(100)  # a copy: the user's input is untouched
    assert torch.equal(x.detach(), torch.ones(2))


def test_call_inputs_of_the_root_module_with_empty_name():
    m = nn.Linear(2, 2)
    x = torch.full((1, 2), 5.0)
    args, _ = call_inputs(m, lambda: m(x), "", 0)
    assert torch.equal(args[0], x) and args[0] is not x


def test_call_inputs_removes_its_hook_when_the_rerun_raises():
    m = Twice()

    def boom():
        raise ValueError("model broke")

    with pytest.raises(ValueError, match="model broke"):
        call_inputs(m, boom, "lin", 0)
    assert hookless(m)


# --- backward_region ----------------------------------------------------------------------------


class TwoOut(nn.Module):
    def forward(self, x):
        return x * 2, x * 3


class UsesOne(nn.Module):
    """Only the first output of TwoOut reaches the loss."""

    def __init__(self):
        super().__init__()
        self.two = TwoOut()

    def forward(self, x):
        a, _b = self.two(x)
        return (a * 5).sum()


def test_backward_region_gives_none_for_an_output_no_gradient_reached():
    m = UsesOne()
    x = torch.ones(3, requires_grad=True)
    target, args, kwargs, grads = backward_region(m, lambda: m(x).backward(), "two", 0)
    assert target is m.two and torch.equal(args[0], torch.ones(3)) and kwargs == {}
    assert len(grads) == 2
    assert torch.equal(grads[0], torch.full((3,), 5.0))
    assert grads[1] is None
    assert hookless(m)


def test_backward_region_of_the_second_call_of_a_shared_module():
    torch.manual_seed(0)
    m = Twice()
    x = torch.ones(1, 2)
    target, args, _, grads = backward_region(m, lambda: m(x).sum().backward(), "lin", 1)
    assert target is m.lin
    assert torch.allclose(args[0], m.lin(x).detach() * 2)
    # the gradient reaching the second call's output is the head's weight row
    assert len(grads) == 1 and torch.allclose(grads[0], m.head.weight.detach())


def test_backward_region_removes_its_hooks_when_the_step_raises():
    m = Twice()

    def step():
        m(torch.ones(1, 2))
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        backward_region(m, step, "lin", 0)
    assert hookless(m)


# --- child_calls --------------------------------------------------------------------------------


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)

    def forward(self, x):
        return self.a(x) + 1


class Outer(nn.Module):
    """``blocks`` is a ModuleList never called itself; ``inner`` nests a Linear (not outermost)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
        self.inner = Inner()

    def forward(self, x, bias=None):
        for b in self.blocks:
            x = b(x)
        x = self.inner(x)
        return x if bias is None else x + bias


def test_child_calls_lists_outermost_calls_in_order_with_copies():
    torch.manual_seed(0)
    m = Outer()
    x = torch.ones(1, 2)
    calls = child_calls(m, "model.enc", lambda: m(x, bias=torch.zeros(2)))
    assert [c.name for c in calls] == ["model.enc.blocks.0", "model.enc.blocks.1", "model.enc.inner"]
    assert calls[0].module is m.blocks[0] and calls[2].module is m.inner
    assert torch.equal(calls[0].args[0], x) and calls[0].kwargs == {}
    with torch.no_grad():
        h0 = m.blocks[0](x)
        h1 = m.blocks[1](h0)
        out = m.inner(h1)
    assert torch.allclose(calls[1].args[0], h0) and torch.allclose(calls[1].output, h1)
    assert torch.allclose(calls[2].output, out)
    assert not calls[2].output.requires_grad  # detached copies
    assert hookless(m)


def test_child_calls_without_prefix_and_a_repeated_child():
    m = Twice()
    calls = child_calls(m, "", lambda: m(torch.ones(1, 2)))
    assert [c.name for c in calls] == ["lin", "lin", "head"]


def test_child_calls_removes_hooks_when_the_run_raises():
    m = Outer()
    with pytest.raises(RuntimeError):
        child_calls(m, "", lambda: m(torch.ones(1, 3)))  # wrong width: the first Linear raises
    assert hookless(m)


# --- first_call_order ---------------------------------------------------------------------------


def test_first_call_order_is_the_order_of_first_calls_not_of_definition():
    class Backwards(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(2, 2)
            self.second = nn.Linear(2, 2)
            self.unused = nn.Linear(2, 2)

        def forward(self, x):
            x = self.second(x)
            x = self.first(x)
            return self.second(x)  # called again: listed once

    m = Backwards()
    order = first_call_order(m, lambda: m(torch.ones(1, 2)))
    assert order == ["", "second", "first"]
    assert hookless(m)


# --- rows_holding_faults ------------------------------------------------------------------------


class Embed(nn.Module):
    """input_ids → embedding → linear; token 3's embedding row is +inf."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 2)
        self.lin = nn.Linear(2, 2)
        with torch.no_grad():
            self.emb.weight[3] = math.inf

    def forward(self, input_ids):
        return self.lin(self.emb(input_ids))


def test_rows_holding_faults_names_the_rows_with_a_nonfinite_output():
    m = Embed()
    ids = torch.tensor([[0, 1], [2, 3], [1, 1], [3, 0]])
    snap = Snapshot.of((), {"input_ids": ids})
    assert rows_holding_faults(m, snap, contextlib.nullcontext()) == [1, 3]
    assert hookless(m)
    assert torch.equal(ids, torch.tensor([[0, 1], [2, 3], [1, 1], [3, 0]]))  # re-run from a copy


def test_rows_holding_faults_falls_back_to_row_zero_when_none_fails():
    m = Embed()
    snap = Snapshot.of((), {"input_ids": torch.tensor([[0, 1], [2, 4]])})
    assert rows_holding_faults(m, snap, contextlib.nullcontext()) == [0]


def test_rows_holding_faults_runs_inside_the_given_precision_without_grad():
    entered = []

    @contextlib.contextmanager
    def precision():
        entered.append(torch.is_grad_enabled())
        yield

    m = Embed()
    snap = Snapshot.of((), {"input_ids": torch.tensor([[3]])})
    assert rows_holding_faults(m, snap, precision()) == [0]
    assert entered == [False]
