"""integrations/lightning.py: the Lightning callback on its own — driven through its hooks around a
plain loop, with a real LightningModule, optimizer, GradScaler and ModelCheckpoint and a stand-in
for the Trainer's few attributes it reads: ``trainer.global_step`` names the step, ``should_stop``
at the first fault, what hides a NaN loss (the GradScaler, a ModelCheckpoint monitoring a loss)
named when Lightning logs and at the end. (Inside a real ``Trainer.fit``:
tests/integration/test_callback_lightning.py.)"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

L = pytest.importorskip("lightning")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from nan_hunter.integrations.lightning import NanHunterCallback  # noqa: E402


class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        with torch.no_grad():
            self.lin.weight.fill_(0.5)
            self.lin.bias.zero_()

    def forward(self, x):
        return torch.exp(self.lin(x))


def _trainer(opt, callbacks=(), scaler=None, every=50):
    """The attributes of ``lightning.Trainer`` the callback reads, and nothing else."""
    return SimpleNamespace(
        optimizers=[opt],
        precision_plugin=SimpleNamespace(scaler=scaler),
        global_step=0,
        log_every_n_steps=every,
        callbacks=list(callbacks),
        should_stop=False,
        strategy=None,
    )


def _fit(cb, trainer, module, fault_at: int, steps: int = 4) -> int:
    opt = trainer.optimizers[0]
    cb.on_train_start(trainer, module)
    for i in range(steps):
        trainer.global_step = i
        cb.on_train_batch_start(trainer, module, None, i)
        opt.zero_grad()
        loss = module(torch.full((1, 2), 200.0 if i == fault_at else 0.1)).sum()
        loss.backward()
        opt.step()
        cb.on_train_batch_end(trainer, module, {"loss": loss}, None, i)
        if trainer.should_stop:
            break
    cb.on_train_end(trainer, module)
    return i


@pytest.fixture
def said(caplog):
    with caplog.at_level(logging.WARNING, logger="lightning.pytorch"):
        yield lambda: [r.getMessage() for r in caplog.records if r.name == "lightning.pytorch"]


def test_stop_at_the_planted_step(said):
    m = Module()
    trainer = _trainer(torch.optim.SGD(m.parameters(), lr=0.01))
    cb = NanHunterCallback(level="modules")
    assert _fit(cb, trainer, m, fault_at=2) == 2 and trainer.should_stop
    f = cb.report.first_nonfinite
    assert (f.step, f.module, f.op) == (2, "", "aten.exp.default")  # the root's own exp
    assert said()[0].startswith("nanhunter: first non-finite value (posinf) at step 2")
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_what_hides_a_nan_loss_is_named(said):
    m = Module()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    trainer = _trainer(
        opt, callbacks=[ModelCheckpoint(monitor="train_loss")], scaler=torch.amp.GradScaler("cpu"), every=2
    )
    cb = NanHunterCallback(level="modules", on_fault="skip")
    _fit(cb, trainer, m, fault_at=1)
    (line,) = [s for s in said() if "was non-finite, and" in s]  # named once, when Lightning logs step 1
    assert line.startswith(
        "nanhunter: the loss of step 1 was non-finite, and the GradScaler skipped the optimizer step"
    )
    assert "ModelCheckpoint(monitor='train_loss') ranks a NaN train_loss as ±inf" in line


def test_an_exception_removes_the_hooks():
    m = Module()
    trainer = _trainer(torch.optim.SGD(m.parameters(), lr=0.01))
    cb = NanHunterCallback(level="modules")
    cb.on_train_start(trainer, m)
    assert any(mod._forward_hooks for mod in m.modules())
    cb.on_exception(trainer, m, RuntimeError("boom"))
    assert not any(mod._forward_hooks for mod in m.modules()) and cb.report is None
