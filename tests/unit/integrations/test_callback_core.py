"""integrations/callback_core.py: what both framework callbacks do, without a framework — stop,
raise or skip at the first fault of a plain training loop (the framework's step numbers, the
report written and logged, the failing update undone), the optimizer found inside its wrapper.
What hides a non-finite loss: each
step's loss is a device flag read only when the framework logs; a step is named once; a GradScaler
(it skips the step without a word) is named when the framework has one."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from nan_hunter.errors import NonFiniteError
from nan_hunter.integrations.callback_core import (
    CallbackCore,
    LossFlags,
    loss_of,
    torch_optimizer,
)


def test_loss_flags_name_each_bad_step_once():
    flags = LossFlags()
    flags.add(0, torch.tensor(1.0))
    flags.add(1, torch.tensor(float("nan")))
    flags.add(1, torch.tensor(2.0))  # gradient accumulation: a second micro-batch of step 1
    flags.add(2, torch.tensor(float("inf")))
    assert flags.new_bad_steps() == [1, 2]
    flags.add(2, torch.tensor(float("nan")))
    flags.add(3, torch.tensor(0.5))
    assert flags.new_bad_steps() == []


def test_loss_of_reads_every_shape_of_output():
    loss = torch.tensor(1.0)

    class Out:
        pass

    o = Out()
    o.loss = loss
    assert loss_of({"loss": loss}) is loss and loss_of(o) is loss and loss_of(loss) is loss
    assert loss_of(torch.ones(3)) is None and loss_of(None) is None and loss_of({"logits": loss}) is None


def test_hidden_losses_names_the_scaler(caplog):
    core = CallbackCore("blocks", "record", None, None, None, logging.getLogger("test.callback"))
    core.scaler = object()
    core.losses.add(7, torch.tensor(float("nan")))
    with caplog.at_level(logging.WARNING, logger="test.callback"):
        core.hidden_losses(core.scaler_phrase())
        core.hidden_losses(core.scaler_phrase())  # said once
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "nanhunter: the loss of step 7 was non-finite, and the GradScaler skipped the optimizer step "
        "without a word (it only lowered its scale), so training went on as if nothing happened"
    ]


def test_nothing_said_when_nothing_hid_it(caplog):
    core = CallbackCore("blocks", "record", None, None, None, logging.getLogger("test.callback"))
    core.losses.add(1, torch.tensor(float("nan")))
    with caplog.at_level(logging.WARNING, logger="test.callback"):
        core.hidden_losses([])
    assert caplog.records == []


# --- the core around a plain training loop ---------------------------------------------------------------
class Exp(torch.nn.Module):
    def forward(self, x):
        return torch.exp(x)


def _model():
    """exp(Linear(x)) with weights 0.5: x = 200 gives exp(200), +inf in fp32; x = 0.1 stays finite."""
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), Exp())
    with torch.no_grad():
        m[0].weight.fill_(0.5)
        m[0].bias.zero_()
    return m


def _loop(core, model, opt, fault_at: int, steps: int = 4) -> list[int]:
    """A framework's loop: step_begin, forward/backward/step, step_end; returns the steps run."""
    ran = []
    for step in range(steps):
        core.step_begin(step)
        x = torch.full((1, 2), 200.0 if step == fault_at else 0.1)
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        ran.append(step)
        if core.step_end():
            break
    core.end()
    return ran


class Wrapped:
    """What accelerate and Lightning hand a callback: the optimizer inside a wrapper."""

    def __init__(self, inner):
        self.optimizer = inner
        self.param_groups = inner.param_groups


def test_torch_optimizer_unwraps():
    opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    assert torch_optimizer(opt) is opt and torch_optimizer(Wrapped(Wrapped(opt))) is opt
    assert torch_optimizer(None) is None and torch_optimizer(object()) is None


def test_stop_at_the_first_fault_writes_and_logs(tmp_path, caplog):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    core = CallbackCore("modules", "stop", None, str(tmp_path / "r.json"), None, logging.getLogger("test.cb"))
    core.start(model, Wrapped(opt))
    with caplog.at_level(logging.WARNING, logger="test.cb"):
        assert _loop(core, model, opt, fault_at=2) == [0, 1, 2]
    f = core.report.first_nonfinite
    assert (f.step, f.module) == (2, "1")  # the framework's own step number
    rep = json.loads((tmp_path / "r.json").read_text())
    assert (
        rep["schema"] == "nanhunter.report/v1"
        and rep["mode"] == "watch"
        and rep["checkpoint"]["path"] == "watch()"
    )  # one report for watch() and callbacks
    (line,) = [r.getMessage() for r in caplog.records if r.name == "test.cb"]  # the framework's logger
    assert line == (
        "nanhunter: first non-finite value (posinf) at step 2, forward: aten.exp.default in 1 (overflow: "
        f"exp overflow in fp32 at aten.exp.default in 1) · report: {tmp_path / 'r.json'}"
    )
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the failing update was undone


def test_raise_removes_the_hooks_and_raises(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    core = CallbackCore("modules", "raise", None, None, None, logging.getLogger("test.cb"))
    core.start(model, opt)
    with pytest.raises(NonFiniteError) as e:
        _loop(core, model, opt, fault_at=1)
    assert e.value.report is core.report and core.watch is None
    assert not any(m._forward_hooks for m in model.modules())


def test_skip_goes_on_and_reports_every_skipped_step():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    core = CallbackCore("modules", "skip", None, None, None, logging.getLogger("test.cb"))
    core.start(model, opt)
    assert _loop(core, model, opt, fault_at=1) == [0, 1, 2, 3]
    assert core.report.first_nonfinite.step == 1 and core.report.run["skipped_steps"] == [1]


def test_a_clean_run_writes_nothing(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    core = CallbackCore("modules", "stop", None, str(tmp_path / "r.json"), None, logging.getLogger("test.cb"))
    core.start(model, opt)
    assert _loop(core, model, opt, fault_at=-1) == [0, 1, 2, 3]
    assert core.report is None and not (tmp_path / "r.json").exists()


def test_skip_needs_the_frameworks_optimizer():
    core = CallbackCore("modules", "skip", None, None, None, logging.getLogger("test.cb"))
    with pytest.raises(ValueError, match="needs the framework's optimizer"):
        core.start(_model(), None)


def test_the_sentinel_level_and_its_sampling_reach_the_watch():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    core = CallbackCore(
        "sentinel", "record", None, None, None, logging.getLogger("test.callback"), sample_every=3
    )
    core.start(model, opt)
    try:
        assert (core.watch.level, core.watch.sample_every) == ("sentinel", 3)
    finally:
        core.watch.__exit__(None, None, None)
