"""nan_hunter/session/training.py, the helpers around a training step: the GradScaler's state
read without a sync, optimizer hyperparameters as JSON, a model's own precision, and the aten op
of an optimizer step re-run from its pre-step copy (real fp16 Adam, eps underflowing to 0)."""

from __future__ import annotations

import json

import torch
from torch import nn

from nan_hunter.session.training import _enabled, _hyper, _optimizer_op, _run_of, _scale_of


def test_scaler_enabled_and_scale_without_a_sync():
    s = torch.amp.GradScaler("cpu", init_scale=1024.0)
    assert _enabled(s) and _scale_of(s) == 1024.0  # before its first use: the initial value
    s.scale(torch.ones(1))  # now it holds a scale tensor
    got = _scale_of(s)
    assert isinstance(got, torch.Tensor) and float(got) == 1024.0
    got.fill_(1.0)  # a copy: the scaler's own is untouched
    assert float(s.get_scale()) == 1024.0
    off = torch.amp.GradScaler("cpu", enabled=False)
    assert not _enabled(off)
    assert _enabled(object())  # a scaler-like object without is_enabled(): taken as enabled


def test_hyperparameters_are_json_without_params_and_with_plain_numbers():
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.Adam([p], lr=torch.tensor(0.5), betas=(0.8, 0.9), eps=1e-6)
    h = _hyper(opt.param_groups[0])
    assert "params" not in h
    assert h["lr"] == 0.5 and isinstance(h["lr"], float)  # a one-element tensor lr becomes a number
    assert h["betas"] == [0.8, 0.9] and h["eps"] == 1e-6
    json.dumps(h, allow_nan=False)  # every value survives JSON


def test_run_of_is_the_parameters_dtype():
    assert _run_of(nn.Linear(2, 2).half()).name == "fp16"
    assert _run_of(nn.Linear(2, 2).to(torch.bfloat16)).name == "bf16"
    assert _run_of(nn.ReLU()) is None  # no parameters: no precision to name


def fp16_adam():
    p = nn.Parameter(torch.ones(4, dtype=torch.float16))
    opt = torch.optim.Adam([p], lr=1e-3, eps=1e-8, foreach=False)  # eps is 0 in fp16
    pre = {"grads": {"w": torch.zeros(4, dtype=torch.float16)}, "weights": {"w": torch.ones(4, dtype=torch.float16)},
           "groups": {"w": 0}, "state": {}}
    return p, opt, pre


def test_optimizer_op_names_the_op_that_divided_by_zero_without_touching_the_users_parameter():
    p, opt, pre = fp16_adam()
    ev = _optimizer_op(opt, "w", pre)
    assert ev is not None and ev.op == "aten.addcdiv_.default" and ev.kind == "nan" and ev.nan == 4
    assert torch.equal(p.detach(), torch.ones(4, dtype=torch.float16)) and p.grad is None and not opt.state
    assert torch.equal(pre["weights"]["w"], torch.ones(4, dtype=torch.float16))  # the pre-step copy too


def test_optimizer_op_without_the_parameter_or_outside_torch_optim_names_nothing():
    p, opt, pre = fp16_adam()
    assert _optimizer_op(opt, "other", pre) is None

    class Mine(torch.optim.SGD):
        pass

    assert _optimizer_op(Mine([p], lr=0.1), "w", pre) is None  # its class lives outside torch.optim
    fine = {**pre, "grads": {"w": torch.ones(4, dtype=torch.float16)}}
    assert _optimizer_op(torch.optim.SGD([p], lr=0.1), "w", fine) is None  # a finite step: no op
