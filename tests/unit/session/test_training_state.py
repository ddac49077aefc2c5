"""nan_hunter/session/training_state.py, the helpers around a training step: the GradScaler's state
read without a sync, optimizer hyperparameters as JSON, and the watch's re-runs (``WatchRerun``):
a model's own precision, the optimizer's pre-step copy as ``OptimizerPieces``."""

from __future__ import annotations

import json

import torch
from torch import nn

from nan_hunter.session.training_state import WatchRerun, _enabled, _hyper, _scale_of
from nan_hunter.session.watcher import Watch


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


def test_a_watch_without_a_dtype_runs_in_its_parameters_dtype():
    assert WatchRerun(Watch(nn.Linear(2, 2).half())).precision(0, "forward").name == "fp16"
    assert WatchRerun(Watch(nn.Linear(2, 2).to(torch.bfloat16))).precision(3, "forward").name == "bf16"
    assert WatchRerun(Watch(nn.ReLU())).precision(0, "forward") is None  # no parameters: no precision to name


def test_the_optimizer_pieces_of_a_watch_come_from_its_pre_step_copy_only():
    m = nn.Linear(2, 2)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, betas=(0.8, 0.9))
    w = Watch(m, optimizer=opt)
    assert w.rerun.optimizer(0) is None  # nothing copied before the step (no capsule_dir)
    w.training.pre_step = {
        "step": 3,
        "weights": {"weight": torch.ones(2, 2)},
        "grads": {"weight": torch.zeros(2, 2)},
        "state": {},
        "groups": {"weight": 0},
    }
    assert w.rerun.optimizer(2) is None  # another step's copy
    pieces = w.rerun.optimizer(3)
    assert (
        pieces.cls is torch.optim.Adam
        and pieces.hyper[0]["betas"] == (0.8, 0.9)
        and "params" not in pieces.hyper[0]
    )
    assert pieces.has("weight") and not pieces.has("bias")
