"""The oracle's own rules (``tests/oracle/truth.py``), on hand-built nets whose answer is known
by construction, before it is trusted to judge nanhunter. No nanhunter here."""

from __future__ import annotations

import pytest
import torch
from oracle.truth import Tracer, value_of
from torch import nn


class Overflow(nn.Module):
    def __init__(self, w: float = 30000.0):
        super().__init__()
        self.up = nn.Linear(4, 4, bias=False)
        self.down = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.up.weight.fill_(1.0)
            self.down.weight.fill_(w)

    def forward(self, x):
        return self.down(self.up(x))


def truth_of(model, *args, optimizer=None, run=None):
    with Tracer(model, optimizer) as tr:
        (run or model)(*args)
    return tr.truth(), tr


def test_matmul_overflow_names_the_linear_its_op_and_the_numbers():
    m = Overflow().half()
    t, _ = truth_of(m, torch.ones(2, 4, dtype=torch.float16))
    assert (t.role, t.phase, t.step, t.module, t.kind, t.cause) == (
        "producer",
        "forward",
        0,
        "down",
        "posinf",
        "overflow",
    )
    assert t.op in ("aten.mm.default", "aten.addmm.default")
    assert t.event.exact_absmax == 4 * 4 * 30000.0  # ones·1 = 4 per channel, · 30000 · 4
    assert sorted(o.absmax for o in t.event.operands) == [4.0, 30000.0]


def test_in_place_op_is_judged_against_its_operand_before_the_op():
    class InPlace(nn.Module):
        def forward(self, x):
            y = x.clone()
            y.mul_(1e5)  # 1 · 1e5 > 65504: +inf written into y
            return y

    t, _ = truth_of(InPlace(), torch.ones(3, dtype=torch.float16))
    assert (t.op, t.kind, t.cause) == ("aten.mul_.Tensor", "posinf", "overflow")
    assert t.event.operands[0].absmax == 1.0  # the operand as it was, not the +inf it became


def test_absorbed_intermediate_is_not_a_fault():
    class RMS(nn.Module):
        def forward(self, x):  # pow → inf, rsqrt(inf) = 0: the output is finite (and wrong)
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))

    t, tr = truth_of(RMS(), torch.full((2, 4), 300.0, dtype=torch.float16))
    assert (
        t is None
        and tr.events
        and tr.events[0].op == "aten.pow.Tensor_Scalar"
        and tr.events[0].reached is False
    )


def test_neginf_mask_absorbed_by_softmax_is_no_fault_but_a_neginf_reaching_the_output_is():
    class Mask(nn.Module):
        def forward(self, x, keep):
            return torch.softmax(x.masked_fill(~keep, float("-inf")), -1)

    keep = torch.tensor([[True, False, True]])
    t, tr = truth_of(Mask(), torch.ones(1, 3), keep)
    assert t is None and tr.events[0].op == "aten.masked_fill.Scalar" and tr.events[0].new == {"neginf"}

    class Leak(nn.Module):
        def forward(self, x, keep):
            return x.masked_fill(~keep, float("-inf"))

    t, _ = truth_of(Leak(), torch.ones(1, 3), keep)
    assert (t.op, t.kind, t.module) == ("aten.masked_fill.Scalar", "neginf", "")


def test_neginf_op_is_not_named_when_the_same_call_later_makes_nan():
    class Both(nn.Module):
        def forward(self, x):
            m = x.masked_fill(x > 0, float("-inf"))  # −inf only
            return m - m  # −inf − (−inf) = NaN: the op named

    t, _ = truth_of(Both(), torch.ones(2))
    assert (t.op, t.kind) == ("aten.sub.Tensor", "nan")


def test_completion_order_an_outer_mask_before_an_inner_fault():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Overflow().half()

        def forward(self, x):
            mask = torch.zeros(2, 4, dtype=x.dtype).masked_fill(
                torch.ones(2, 4, dtype=torch.bool), float("-inf")
            )
            return self.inner(x) + mask.exp()  # the mask event comes first, in the outer call

    t, _ = truth_of(Outer(), torch.ones(2, 4, dtype=torch.float16))
    assert t.module == "inner.down" and t.kind == "posinf"


def test_backward_fault_is_named_after_the_module_that_created_the_node():
    class Gate(nn.Module):
        def forward(self, x):
            return x * torch.sqrt((x * x).mean(-1, keepdim=True))

    m = nn.Sequential(nn.Linear(4, 4), Gate(), nn.Linear(4, 1))
    with torch.no_grad():
        m[0].weight.zero_()
        m[0].bias.zero_()
    with Tracer(m) as tr:
        m(torch.ones(2, 4)).sum().backward()  # forward 0; backward sqrt'(0): 0/0
    t = tr.truth()
    assert (t.phase, t.step, t.module, t.op, t.kind, t.grad_fn, t.cause) == (
        "backward",
        0,
        "1",
        "aten.div.Tensor",
        "nan",
        "SqrtBackward0",
        "division_by_zero",
    )


def test_optimizer_fault_first_parameter_in_param_groups_order():
    m = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 1)).half()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-8)  # 1e-8 is 0 in fp16

    def step(ids):
        m(ids).float().sum().backward()
        opt.step()

    t, _ = truth_of(m, torch.tensor([1, 2]), optimizer=opt, run=step)
    assert (t.phase, t.param, t.module, t.kind, t.cause) == (
        "optimizer",
        "0.weight",
        "0",
        "nan",
        "division_by_zero",
    )
    facts = t.optimizer_facts
    assert facts["n_bad"] >= 6 * 4 and facts["state"]["exp_avg_sq"]["zeros_bad"] >= 6 * 4  # the unused rows


def test_steps_count_root_calls_and_decode_positions_come_from_the_mask():
    class Tok(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(8, 4)
            with torch.no_grad():
                self.emb.weight.fill_(1.0)
                self.emb.weight[7] = 70000.0  # finite in fp32, +inf once cast to fp16

        def forward(self, input_ids, attention_mask):
            return self.emb(input_ids).half()

    m = Tok()
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # row 0 left-padded by one
    with Tracer(m) as tr:
        m(input_ids=torch.tensor([[2, 2, 2], [2, 2, 2]]), attention_mask=mask[:, :3])
        ids = torch.tensor([[2, 7], [2, 2]])  # step 1: two new tokens after three cached ones
        m(input_ids=ids, attention_mask=torch.cat([mask, torch.ones(2, 2, dtype=mask.dtype)], 1))
    t = tr.truth()
    assert (t.step, t.row, t.op, t.token_id) == (1, 0, "aten._to_copy.default", 7)
    assert t.position == 3  # column 4 of row 0, minus its one pad


def test_float8_training_tensor_value_is_data_over_scale():
    f8 = pytest.importorskip("torchao.float8.float8_training_tensor")
    x = torch.tensor([[0.5, -2.0], [1.0, 0.25]], dtype=torch.bfloat16)
    t = f8.hp_tensor_and_scale_to_float8(x, torch.tensor(224.0), torch.float8_e4m3fn, f8.LinearMMConfig())
    assert float(value_of(t).abs().max()) == 2.0
