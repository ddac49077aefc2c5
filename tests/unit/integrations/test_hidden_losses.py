"""What hides a non-finite loss, named by the callbacks' shared core without a framework: each
step's loss is a device flag read only when the framework logs; a step is named once; a GradScaler
(it skips the step without a word) is named when the framework has one."""

from __future__ import annotations

import logging

import torch

from nan_hunter.integrations.callback_core import CallbackCore, LossFlags, loss_of


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
    assert said == ["nanhunter: the loss of step 7 was non-finite, and the GradScaler skipped the optimizer step "
                    "without a word (it only lowered its scale), so training went on as if nothing happened"]


def test_nothing_said_when_nothing_hid_it(caplog):
    core = CallbackCore("blocks", "record", None, None, None, logging.getLogger("test.callback"))
    core.losses.add(1, torch.tensor(float("nan")))
    with caplog.at_level(logging.WARNING, logger="test.callback"):
        core.hidden_losses([])
    assert caplog.records == []
