"""integrations/transformers.py: the Trainer callback on its own — driven through its hooks with the
Trainer's own small objects (TrainingArguments, TrainerState, TrainerControl) around a plain loop:
steps named by ``state.global_step``, ``should_training_stop`` at the first fault, the losses the
Trainer's ``logging_nan_inf_filter`` hides named when it logs, the hooks gone at the end. (Inside a
real ``Trainer.train``: tests/integration/test_callback_transformers.py.)"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("transformers")
from transformers import TrainerControl, TrainerState, TrainingArguments  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from nan_hunter.integrations.transformers import NanHunterCallback  # noqa: E402


class Net(torch.nn.Module):
    """exp(Linear(x)) summed as the loss (weights 0.5): x = 200 overflows fp32."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        with torch.no_grad():
            self.lin.weight.fill_(0.5)
            self.lin.bias.zero_()

    def forward(self, x):
        return {"loss": torch.exp(self.lin(x)).sum()}


class Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def said():
    """What the callback logs through transformers' trainer logger (transformers' loggers do not
    propagate to the root, so pytest's capture does not see them)."""
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    h = Said()
    lg = logging.getLogger("transformers.trainer")
    lg.addHandler(h)
    yield h.lines
    lg.removeHandler(h)
    hf_logging.set_verbosity(before)


def _train(cb, tmp_path, fault_at: int, steps: int = 4, **args):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    a = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], **args)
    state, control = TrainerState(), TrainerControl()
    cb.on_train_begin(a, state, control, model=model, optimizer=opt)
    for step in range(steps):
        state.global_step = step
        cb.on_step_begin(a, state, control)
        model.train()
        opt.zero_grad()
        model(torch.full((1, 2), 200.0 if step == fault_at else 0.1))["loss"].backward()
        opt.step()
        cb.on_step_end(a, state, control)
        if control.should_training_stop:
            break
    cb.on_log(a, state, control, logs={"loss": 1.0})
    cb.on_train_end(a, state, control)
    return model, step


def test_stop_at_the_planted_step(tmp_path, said):
    cb = NanHunterCallback(level="modules", report_path=str(tmp_path / "r.json"))
    model, last = _train(cb, tmp_path, fault_at=1)
    f = cb.report.first_nonfinite
    assert last == 1 and (f.step, f.module, f.op) == (1, "", "aten.exp.default")  # the root's own exp
    assert (tmp_path / "r.json").exists()
    assert any(line.startswith("nanhunter: first non-finite value (posinf) at step 1") for line in said)
    assert not any(m._forward_hooks for m in model.modules())  # the loss hook and the watch are gone


def test_the_filter_that_hides_a_nan_loss_is_named(tmp_path, said):
    cb = NanHunterCallback(level="modules", on_fault="skip")
    _train(cb, tmp_path, fault_at=2)
    assert [line for line in said if "logging_nan_inf_filter" in line] == [
        "nanhunter: the loss of step 2 was non-finite, and transformers' logging_nan_inf_filter (True by default) "
        "left it out of the logged 'loss', which averages the finite steps instead: the logs look healthy; "
        "TrainingArguments(logging_nan_inf_filter=False) logs it as it is"
    ]


def test_nothing_hides_it_without_the_filter(tmp_path, said):
    cb = NanHunterCallback(level="modules", on_fault="skip")
    _train(cb, tmp_path, fault_at=2, logging_nan_inf_filter=False)
    assert not any("was non-finite, and" in line for line in said)


def test_a_clean_run(tmp_path, said):
    cb = NanHunterCallback(level="modules", report_path=str(tmp_path / "r.json"))
    _, last = _train(cb, tmp_path, fault_at=-1)
    assert last == 3 and cb.report is None and not (tmp_path / "r.json").exists() and said == []
