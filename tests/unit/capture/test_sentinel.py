"""``capture.sentinel``: one fused reduction says whether any tensor went non-finite (NaN, +inf,
−inf; never a false alarm from large finite values), and ``Recorder(level="sentinel")`` on small
real models: only the root hooked, blocks hooked for a sampled step alone, a non-finite value masked
before the outputs is latent (not a fault), gradients and updates judged once per phase."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.capture.recorder import Recorder
from nan_hunter.capture.sentinel import (
    any_nonfinite,
    float_tensors_of,
    nonfinite_flag,
    optimizer_state_tensors,
)

INF = float("inf")


@pytest.mark.parametrize(
    "name,value,bad",
    [
        ("finite", 1.0, False),
        ("largest fp16", 65504.0, False),
        ("NaN", float("nan"), True),
        ("+inf", INF, True),
        ("-inf", -INF, True),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_one_reduction_sees_every_kind_of_nonfinite(name, value, bad, dtype):
    ts = [
        torch.ones(5, dtype=dtype),
        torch.tensor([2.0, value]).to(dtype),
        torch.zeros(3, 3, dtype=torch.float32),
    ]
    flag = nonfinite_flag(ts)
    assert flag.dtype == torch.bool and flag.dim() == 0
    assert bool(flag) is bad
    assert any_nonfinite(ts) is bad


def test_large_finite_values_do_not_overflow_the_reduction():
    """A sum or an L2 norm of many values near fp16's max overflows; ord ∞ cannot."""
    assert not any_nonfinite([torch.full((10_000,), 60000.0, dtype=torch.float16)])


def test_nothing_to_judge_is_finite():
    assert nonfinite_flag([]) is None
    assert not any_nonfinite([])


def test_only_floating_nonempty_tensors_are_judged():
    ts = float_tensors_of([torch.arange(3), None, torch.empty(0), torch.ones(2, requires_grad=True), "x"])
    assert len(ts) == 1 and not ts[0].requires_grad


def test_optimizer_state_tensors_are_labelled_per_parameter():
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones(3)
    assert optimizer_state_tensors(opt, [p]) == [[]]  # no state before the first step
    opt.step()
    (st,) = optimizer_state_tensors(opt, [p])
    assert sorted(k for k, _ in st) == [
        "exp_avg",
        "exp_avg_sq",
    ]  # the 0-dim step count is not a tensor of values


# -- the recorder at level "sentinel" -----------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.lin(x))
        return y * torch.tensor(float("nan")) if self.poison else y


class Net(nn.Module):
    """Two blocks in a ModuleList; block 1 makes NaN at its output when ``poison`` is set, and the
    root masks it (``nan_to_num``) when ``mask`` is set: a latent fault."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(4, 2)
        self.mask = False

    @property
    def poison(self) -> bool:
        return self.layers[1].poison

    @poison.setter
    def poison(self, value: bool) -> None:
        self.layers[1].poison = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers[1](self.layers[0](x))
        out = self.head(x)
        return torch.nan_to_num(out) if self.mask else out


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_a_finite_step_hooks_only_the_root_and_a_sampled_one_the_blocks_too():
    m = Net()
    seen = []
    m.layers[0].register_forward_hook(lambda *a: seen.append(_hooks(m)))
    rec = Recorder(m, level="sentinel", sample_every=3)
    with rec, torch.no_grad():
        for _ in range(4):
            m(torch.randn(2, 4))
        assert _hooks(m) == 2 + 1  # the root's two hooks (and the test's own)
    assert _hooks(m) == 1
    assert seen == [1 + 2, 1 + 2, 1 + 2 + 4, 1 + 2]  # step 2 (the 3rd): two blocks' hooks too
    assert rec.sampled_steps == 1
    assert {c.module for c in rec.calls if c.input_index == 2} == {"", "layers.0", "layers.1"}
    assert {c.module for c in rec.calls if c.input_index == 3} == {""}
    assert all(not c.params for c in rec.calls)  # no parameter is judged per call


def test_outputs_are_bitwise_those_of_the_plain_model():
    m = Net()
    x = torch.randn(3, 4)
    with torch.no_grad():
        plain = m(x)
        with Recorder(m, level="sentinel", sample_every=1):
            watched = m(x)
    assert torch.equal(plain, watched)


def test_a_fault_at_the_outputs_is_found_on_any_step():
    m = Net()
    rec = Recorder(m, level="sentinel", sample_every=0)
    with rec, torch.no_grad():
        for i in range(4):
            m.poison = i == 2
            m(torch.randn(2, 4))
    assert rec.first_failed == 2 and rec.latent == []


def test_a_masked_fault_on_a_sampled_step_is_latent_not_a_fault():
    m = Net()
    m.poison = m.mask = True
    rec = Recorder(m, level="sentinel", sample_every=2)
    with rec, torch.no_grad():
        for _ in range(4):
            m(torch.randn(2, 4))
    assert rec.first_failed is None
    assert rec.latent == [{"step": 1, "module": "layers.1"}, {"step": 3, "module": "layers.1"}]
    assert all(c.module == "" for c in rec.calls if c.input_index == 1)  # its inner calls are not a finding


def test_a_masked_fault_on_an_unsampled_step_is_not_seen():
    m = Net()
    m.poison = m.mask = True
    rec = Recorder(m, level="sentinel", sample_every=0)
    with rec, torch.no_grad():
        m(torch.randn(2, 4))
    assert rec.first_failed is None and rec.latent == []


def _train(m: nn.Module, rec: Recorder, opt: torch.optim.Optimizer, steps: int, at: int, how: str) -> None:
    with rec:
        for i in range(steps):
            x = torch.randn(2, 4)
            loss = m(x).sum()
            loss.backward()
            if how == "grad" and i == at:
                m.head.bias.grad[0] = float("nan")  # as a backward that made it would leave it
            if how == "update" and i == at:
                opt.param_groups[0]["lr"] = INF
            opt.step()
            opt.zero_grad()


@pytest.mark.parametrize("how,phase", [("update", "optimizer")])
def test_an_update_that_goes_nonfinite_is_found_by_one_reduction(how, phase):
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    rec = Recorder(m, level="sentinel", backward=True, optimizer=opt)
    _train(m, rec, opt, 4, 2, how)
    assert rec.first_failed == 2
    calls = [c for c in rec.calls if c.input_index == 2 and c.phase == phase]
    assert calls and calls[0].param is not None  # measured one by one on the failing step only
    assert not [c for c in rec.calls if c.input_index == 1 and c.phase == phase]


def test_a_finite_training_step_measures_no_gradient_or_parameter():
    m = Net()
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    rec = Recorder(m, level="sentinel", backward=True, optimizer=opt)
    _train(m, rec, opt, 3, -1, "")
    assert rec.first_failed is None
    backward = [c for c in rec.calls if c.phase == "backward"]
    assert all(len(c.outputs) == 0 for c in backward)  # only the gradient at the root's output is kept
    assert not [c for c in rec.calls if c.phase == "optimizer"]


def test_nonfinite_gradients_are_a_backward_fault_of_their_step():
    m = Net()
    rec = Recorder(m, level="sentinel", backward=True)
    with rec:
        for i in range(3):
            m.poison = i == 1
            m.mask = True  # the forward stays finite: nan_to_num; its backward does not (NaN × 0)
            m(torch.randn(2, 4)).sum().backward()
            m.zero_grad()
    assert rec.first_failed == 1
    assert [c.phase for c in rec.calls if c.input_index == 1 and c.outputs and c.phase == "backward"]


def test_on_a_device_the_gradients_flag_is_read_with_the_updates(monkeypatch):
    """A device sink reads one flag per training step: the backward pass leaves its flag unread
    (``take_grad_flag``) and ``optimizer.step()`` reads it with its own; the gradients are then
    measured into the step's backward call, as the host path measures them at once."""
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    rec = Recorder(m, level="sentinel", backward=True, optimizer=opt)
    with rec:
        m.poison, m.mask = True, True  # a finite forward, non-finite gradients (NaN × 0)
        loss = m(torch.randn(2, 4)).sum()
        monkeypatch.setattr(rec, "_rows_on_host", lambda: False)  # as a CUDA sink answers
        loss.backward()
        monkeypatch.undo()
        assert rec._grad_flag is not None and rec.first_failed is None  # nothing read yet
        opt.step()
        assert rec._grad_flag is None
        assert rec.judge_backward([0])  # as a device sink's fold or report() reads the step's rows
    assert rec.first_failed == 0
    assert [c for c in rec.calls if c.phase == "backward" and c.outputs]


def test_a_finite_inference_step_takes_no_stats_row_and_a_failing_one_measures_the_root():
    """No grad capture on a host sink: the root's finite steps are judged by one reduction and
    keep no row; the failing step's root call gets its outputs and every parameter measured
    (the producer rule can then name a weight that went NaN, as a blocks capture of the root does)."""
    m = Net()
    rec = Recorder(m, level="sentinel", sample_every=0)
    with rec, torch.no_grad():
        m(torch.randn(2, 4))
        assert rec.sink.rows_in_use == 0
        m.head.weight[0, 0] = float("nan")
        m(torch.randn(2, 4))
    assert rec.first_failed == 1
    (root,) = [c for c in rec.calls if c.input_index == 1]
    assert root.outputs and {label for label, _ in root.params} >= {"head.weight", "layers.0.lin.weight"}
