"""``NanHunterCallback`` in the real ``lightning.Trainer`` (CPU, a tiny LightningModule): a planted
fault at a known step (a batch that overflows exp() in layers.0.act), stop / skip / raise, the
report file, the capsule replayed by ``nanhunter scan DIR/step-k`` in a new process (rebuilt by
``arch=`` this file's ``factory``), and a clean run bitwise equal to the run without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")

from nan_hunter import NonFiniteError  # noqa: E402
from nan_hunter.integrations.lightning import NanHunterCallback  # noqa: E402

FAULT = 2
STEPS = 5


class Exp(nn.Module):
    def forward(self, x):
        return torch.exp(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = Exp()

    def forward(self, x):
        return self.act(self.lin(x)) * 0.01


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = self(x).pow(2).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def factory():
    return Tiny()


def _data(fault):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(4 * STEPS, 8, generator=g) * 0.1
    if fault:
        xs[4 * FAULT : 4 * FAULT + 4] = 400.0
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs), batch_size=4, shuffle=False)


def _train(fault, callback=None, steps=STEPS):
    torch.manual_seed(0)
    model = Tiny()
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        callbacks=[callback] if callback else [],
    )
    trainer.fit(model, _data(fault))
    return trainer, model


def test_stop_at_the_planted_step_with_report_and_capsule(tmp_path):
    cb = NanHunterCallback(
        capsule_dir=str(tmp_path / "caps"),
        report_path=str(tmp_path / "r.json"),
        arch=f"{Path(__file__).resolve()}:factory",
    )
    trainer, _ = _train(True, cb)
    assert trainer.global_step == FAULT + 1
    f = cb.report.first_nonfinite
    assert (f.step, f.phase, f.module, f.op, f.reproducible) == (
        FAULT,
        "forward",
        "layers.0.act",
        "aten.exp.default",
        True,
    )
    assert cb.report.diagnosis.cause == "overflow"
    assert json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]["module"] == "layers.0.act"
    cap = tmp_path / "caps" / f"step-{FAULT}"
    out = tmp_path / "replay.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "scan", str(cap), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    rf = json.loads(out.read_text())["first_nonfinite"]
    assert (rf["module"], rf["op"], rf["step"]) == ("layers.0.act", "aten.exp.default", FAULT)


def test_stop_saves_the_last_good_state(tmp_path):
    """issue 31 (8), contract v1.3: the failing step's update is not applied, so after stopping the
    parameters and optimizer state are bitwise those of a run that never took that step, and the
    checkpoint the user saves holds finite weights."""
    cb = NanHunterCallback(on_fault="stop")
    trainer, model = _train(True, cb)
    control, model2 = _train(True, None, steps=FAULT)
    assert trainer.global_step == FAULT + 1 and control.global_step == FAULT
    assert cb.report.run["skipped_steps"] == [FAULT] and cb.report.first_nonfinite.step == FAULT
    for (n, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), n
    s1, s2 = trainer.optimizers[0].state_dict(), control.optimizers[0].state_dict()
    assert s1["state"].keys() == s2["state"].keys()
    for k in s1["state"]:
        for name, v in s1["state"][k].items():
            assert torch.equal(v, s2["state"][k][name]), (k, name)
    trainer.save_checkpoint(str(tmp_path / "last.ckpt"))
    saved = torch.load(str(tmp_path / "last.ckpt"), weights_only=False)["state_dict"]
    assert saved and all(torch.isfinite(t).all() for t in saved.values())


def test_skip_goes_on_and_matches_the_run_without_that_batch():
    cb = NanHunterCallback(on_fault="skip")
    trainer, model = _train(True, cb)
    assert trainer.global_step == STEPS
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert cb.report.run["skipped_steps"] == [FAULT] and cb.report.first_nonfinite.step == FAULT


def test_raise():
    with pytest.raises(NonFiniteError) as ei:
        _train(True, NanHunterCallback(on_fault="raise"))
    assert ei.value.report.first_nonfinite.module == "layers.0.act"


def test_clean_run_is_untouched(tmp_path):
    cb = NanHunterCallback(capsule_dir=str(tmp_path / "caps"), report_path=str(tmp_path / "r.json"))
    t1, m1 = _train(False, cb)
    t2, m2 = _train(False)
    assert cb.report is None and not (tmp_path / "caps").exists() and not (tmp_path / "r.json").exists()
    for (n, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), n
    assert {k: float(v) for k, v in t1.logged_metrics.items()} == {
        k: float(v) for k, v in t2.logged_metrics.items()
    }


class Mlp(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.act(self.up(x)))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class HugeWeight(L.Callback):
    """Before step FAULT, weights of ``up`` at 3e38: fp32 holds them, their products do not (one per
    output feature, so each overflowing element is ±inf, never inf − inf)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == FAULT:
            with torch.no_grad():
                for r in range(8):
                    pl_module.up.weight[r, r] = 3e38


def test_an_fp32_overflow_names_the_weight_and_proposes_no_dtype():
    """Contract v1.3: a fix never proposes a dtype the run already used and failed in (the run is
    fp32, and every dtype fails in the replay); the parameter that does not fit is named."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(4 * STEPS, 8, generator=g) * 2),
        batch_size=4,
        shuffle=False,
    )
    cb = NanHunterCallback()
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        callbacks=[HugeWeight(), cb],
    )
    trainer.fit(Mlp(), data)
    rep = cb.report
    f, d = rep.first_nonfinite, rep.diagnosis
    assert (f.step, f.module, f.kind in ("posinf", "neginf")) == (FAULT, "up", True)
    assert rep.run["dtype"] == "fp32" and not any(r["finite"] for k, r in rep.replay.items() if k != "fp64")
    assert f.param == d.param == "up.weight" and d.cause == "overflow" and "up.weight" in d.summary
    assert "fp32" not in d.fix and "bf16" not in d.fix, d.fix
    assert d.fix_verified is None and "Verified" not in d.fix


def test_log_line_names_the_report_and_the_capsule(tmp_path, caplog):
    """issue 32 (4): the verdict line says where the report and the capsule went, with the command
    that replays the capsule."""
    import logging

    cb = NanHunterCallback(
        capsule_dir=str(tmp_path / "caps"),
        report_path=str(tmp_path / "r.json"),
        arch=f"{Path(__file__).resolve()}:factory",
    )
    with caplog.at_level(logging.WARNING):
        _train(True, cb)
    cap = tmp_path / "caps" / f"step-{FAULT}"
    line = next(r.getMessage() for r in caplog.records if "first non-finite value" in r.getMessage())
    assert (
        f"report: {tmp_path / 'r.json'}" in line
        and f"capsule: {cap} (replay it with: nanhunter scan {cap})" in line
    )


def test_model_checkpoint_ranking_a_nan_loss_is_named(tmp_path, caplog):
    """issue 32 (8): ModelCheckpoint(monitor="loss") ranks a NaN loss as inf, so the checkpoints it
    keeps never show it: the callback names the step whose loss was non-finite (training goes on
    with on_fault="skip")."""
    import logging

    from lightning.pytorch.callbacks import ModelCheckpoint

    torch.manual_seed(0)
    cb = NanHunterCallback(on_fault="skip")
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ck"), monitor="loss", every_n_train_steps=1, save_top_k=1)
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        callbacks=[cb, ckpt],
        log_every_n_steps=1,
    )
    with caplog.at_level(logging.WARNING):
        trainer.fit(Tiny(), _data(True))
    said = [r.getMessage() for r in caplog.records if "ModelCheckpoint" in r.getMessage()]
    assert said and said[0].startswith(
        f"nanhunter: the loss of step {FAULT} was non-finite, and ModelCheckpoint("
        "monitor='loss') ranks a NaN loss as ±inf"
    ), said
    assert len(said) == 1  # each step is named once


# -- validation (contract v1.4 run.eval) --------------------------------------------------------------

VAL_BAD = 5  # the validation sample that overflows exp() in layers.0.act


class Validated(Tiny):
    """``validation_step`` returns the per-sample losses (reduction none): counted per sample."""

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        return self(x).pow(2).mean(-1)


def _val_data():
    g = torch.Generator().manual_seed(2)
    xs = torch.randn(8, 8, generator=g) * 0.1
    xs[VAL_BAD] = 400.0
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs), batch_size=4, shuffle=False)


def _fit_validated(callback=None):
    torch.manual_seed(0)
    model = Validated()
    trainer = L.Trainer(
        max_steps=4,
        val_check_interval=2,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        callbacks=[callback] if callback else [],
    )
    trainer.fit(model, _data(False), _val_data())
    return trainer, model


def test_validation_is_counted_per_sample_and_located_without_stopping_training():
    """Two validation loops during ``fit`` (after steps 2 and 4), one bad sample in a batch of 4 each time:
    ``run.eval`` counts 2 per-sample losses in 4 validation steps, the first located at layers.0.act's exp like
    a training fault; training is not stopped (no on_fault for validation) and its weights are bitwise those of
    a run without the callback; the hooks are gone after fit."""
    cb = NanHunterCallback()
    trainer, m1 = _fit_validated(cb)
    _, m2 = _fit_validated()
    assert trainer.global_step == 4 and cb.report is None
    ev = cb.core.eval.as_run()
    assert (ev["steps"], ev["nonfinite_losses"], ev["first_failed"], ev["after_step"]) == (4, 2, 1, 2)
    rep = cb.eval_report
    f = rep.first_nonfinite
    assert (f.step, f.module, f.op) == (1, "layers.0.act", "aten.exp.default")
    assert rep.diagnosis.cause == "overflow" and rep.run["eval"]["first_failed"] == 1
    for (n, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), n
    assert not m1._forward_pre_hooks and not m1._forward_hooks


def test_sampled_steps_log_the_forecast_to_the_trainers_logger(tmp_path):
    """issue 46: with steps sampled (``sample_every=1``) the callback logs ``nanhunter/`` scalars
    through ``trainer.logger.log_metrics`` every ``log_every_n_steps``: a CSVLogger's file has them."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    torch.manual_seed(0)
    logger = CSVLogger(str(tmp_path))
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[NanHunterCallback(sample_every=1)],
    )
    trainer.fit(Tiny(), _data(False))
    rows = list(csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")))
    assert any(r.get("nanhunter/warnings") == "0.0" for r in rows), rows[:2]
