"""``NanHunterCallback`` in the real ``transformers.Trainer`` (CPU, a tiny Llama from a config): a
planted fault at a known step (a batch of token 0, whose embedding row is zero, into an RMSNorm
whose eps is 0: rsqrt(0) = inf), stop / skip / raise, the report file, the capsule replayed by
``nanhunter scan DIR/step-k`` in a new process, and a clean run bitwise equal to the run without it."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from nan_hunter import NonFiniteError  # noqa: E402
from nan_hunter.integrations.transformers import NanHunterCallback  # noqa: E402

FAULT = 2  # global_step whose batch is all token 0
STEPS = 5


@pytest.fixture(autouse=True)
def _transformers_warnings():
    """The verdict is logged at WARNING through transformers' logger: in-process CLI tests earlier in
    the same worker leave transformers' verbosity at ERROR (nanhunter quiets it while it builds a
    model), so it is set for each test here and put back after."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    yield
    hf_logging.set_verbosity(level)


def _model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        rms_norm_eps=0.0,
    )
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():
        m.model.embed_tokens.weight[0].zero_()
    return m


class Data(torch.utils.data.Dataset):
    def __init__(self, fault: bool):
        g = torch.Generator().manual_seed(3)
        self.rows = [torch.randint(1, 32, (8,), generator=g) for _ in range(2 * STEPS)]
        if fault:
            self.rows[2 * FAULT] = torch.zeros(8, dtype=torch.long)
            self.rows[2 * FAULT + 1] = torch.zeros(8, dtype=torch.long)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def _train(tmp_path, fault, callback=None, **args_kw):
    model = _model()
    kw = {"max_steps": STEPS, **args_kw}
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        **kw,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=Data(fault), callbacks=[callback] if callback else []
    )
    trainer.train()
    return trainer, model


def _sequential(monkeypatch):
    # batches in order, so the planted batch is step FAULT's
    monkeypatch.setattr(
        Trainer,
        "_get_train_sampler",
        lambda self, *a, **k: torch.utils.data.SequentialSampler(self.train_dataset),
    )


def test_stop_at_the_planted_step_with_report_and_capsule(tmp_path, monkeypatch, caplog):
    _sequential(monkeypatch)
    cb = NanHunterCallback(capsule_dir=str(tmp_path / "caps"), report_path=str(tmp_path / "r.json"))
    with caplog.at_level(logging.WARNING):
        trainer, _ = _train(tmp_path, True, cb)
    assert trainer.state.global_step == FAULT + 1  # stopped after the failing step
    f = cb.report.first_nonfinite
    assert (f.step, f.phase, f.module) == (FAULT, "forward", "model.layers.0.input_layernorm")
    assert "rsqrt" in f.op and f.reproducible is True
    assert cb.report.diagnosis.cause == "division_by_zero"
    assert any("nanhunter: first non-finite value" in r.getMessage() for r in caplog.records)
    on_disk = json.loads((tmp_path / "r.json").read_text())
    assert on_disk["schema"] == "nanhunter.report/v1" and on_disk["first_nonfinite"]["step"] == FAULT
    cap = tmp_path / "caps" / f"step-{FAULT}"
    assert (cap / "capsule.json").is_file()
    out = tmp_path / "replay.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "scan", str(cap), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    rf = json.loads(out.read_text())["first_nonfinite"]
    assert (rf["module"], rf["op"], rf["step"], rf["phase"]) == (f.module, f.op, FAULT, "forward")


def test_stop_saves_the_last_good_state(tmp_path, monkeypatch):
    """issue 31 (8), contract v1.3: the failing step's update is not applied, so after stopping the
    parameters and optimizer state are bitwise those of a run that never took that step, and
    ``save_model()`` writes finite weights. (A constant learning rate: a decaying schedule depends
    on max_steps, which differs between the two runs.)"""
    from safetensors.torch import load_file

    from nan_hunter.integrations.callback_core import torch_optimizer

    _sequential(monkeypatch)
    cb = NanHunterCallback(on_fault="stop")
    trainer, model = _train(tmp_path / "a", True, cb, lr_scheduler_type="constant")
    control, model2 = _train(tmp_path / "b", True, None, lr_scheduler_type="constant", max_steps=FAULT)
    assert trainer.state.global_step == FAULT + 1 and control.state.global_step == FAULT
    assert cb.report.run["skipped_steps"] == [FAULT] and cb.report.first_nonfinite.step == FAULT
    for (n, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), n
    s1, s2 = torch_optimizer(trainer.optimizer).state_dict(), torch_optimizer(control.optimizer).state_dict()
    assert s1["state"].keys() == s2["state"].keys()
    for k in s1["state"]:
        for name, v in s1["state"][k].items():
            assert torch.equal(v, s2["state"][k][name]), (k, name)
    trainer.save_model(str(tmp_path / "saved"))
    saved = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert saved and all(torch.isfinite(t).all() for t in saved.values())


def test_skip_goes_on_with_finite_weights(tmp_path, monkeypatch):
    _sequential(monkeypatch)
    cb = NanHunterCallback(on_fault="skip")
    trainer, model = _train(tmp_path, True, cb)
    assert trainer.state.global_step == STEPS
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert cb.report.run["skipped_steps"] == [FAULT] and cb.report.first_nonfinite.step == FAULT


def test_raise(tmp_path, monkeypatch):
    _sequential(monkeypatch)
    with pytest.raises(NonFiniteError) as ei:
        _train(tmp_path, True, NanHunterCallback(on_fault="raise"))
    assert ei.value.report.first_nonfinite.module == "model.layers.0.input_layernorm"


def test_clean_run_is_untouched(tmp_path, monkeypatch):
    _sequential(monkeypatch)
    cb = NanHunterCallback(capsule_dir=str(tmp_path / "caps"), report_path=str(tmp_path / "r.json"))
    t1, m1 = _train(tmp_path / "a", False, cb)
    t2, m2 = _train(tmp_path / "b", False)
    assert cb.report is None and not (tmp_path / "caps").exists() and not (tmp_path / "r.json").exists()
    for (n, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), n
    strip = [
        {k: v for k, v in h.items() if "runtime" not in k and "per_second" not in k}
        for h in t1.state.log_history
    ]
    assert strip == [
        {k: v for k, v in h.items() if "runtime" not in k and "per_second" not in k}
        for h in t2.state.log_history
    ]


class _HugeWeight(TrainerCallback):
    """Before step FAULT, weights of layer 0's up_proj at 3e38: fp32 holds them, their products do not
    (one per output feature, so each overflowing element is ±inf, never inf − inf)."""

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == FAULT:
            with torch.no_grad():
                w = model.model.layers[0].mlp.up_proj.weight
                for r in range(w.shape[1]):
                    w[r, r] = 3e38


def test_an_fp32_overflow_names_the_weight_and_proposes_no_dtype(tmp_path, monkeypatch):
    """Contract v1.3: a fix never proposes a dtype the run already used and failed in (the run is
    fp32, and every dtype fails in the replay); the parameter that does not fit is named."""
    _sequential(monkeypatch)
    cb = NanHunterCallback()
    model = _model()
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        max_steps=STEPS,
        learning_rate=1e-2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
    )
    Trainer(model=model, args=args, train_dataset=Data(False), callbacks=[_HugeWeight(), cb]).train()
    rep = cb.report
    f, d = rep.first_nonfinite, rep.diagnosis
    assert (f.step, f.module, f.kind in ("posinf", "neginf")) == (FAULT, "model.layers.0.mlp.up_proj", True)
    assert rep.run["dtype"] == "fp32" and not any(r["finite"] for k, r in rep.replay.items() if k != "fp64")
    assert f.param == d.param == "model.layers.0.mlp.up_proj.weight" and d.cause == "overflow"
    assert "model.layers.0.mlp.up_proj.weight" in d.summary
    assert "fp32" not in d.fix and "bf16" not in d.fix, d.fix
    assert d.fix_verified is None and "Verified" not in d.fix


def test_log_line_names_the_report_and_the_capsule(tmp_path, monkeypatch, caplog):
    """issue 32 (4): nothing hidden — the verdict line says where the report and the capsule went,
    with the command that replays the capsule; each skipped step is logged as it is skipped."""
    _sequential(monkeypatch)
    cb = NanHunterCallback(
        on_fault="skip", capsule_dir=str(tmp_path / "caps"), report_path=str(tmp_path / "r.json")
    )
    with caplog.at_level(logging.WARNING):
        _train(tmp_path, True, cb)
    cap = tmp_path / "caps" / f"step-{FAULT}"
    line = next(r.getMessage() for r in caplog.records if "first non-finite value" in r.getMessage())
    assert f"report: {tmp_path / 'r.json'}" in line
    assert f"capsule: {cap} (replay it with: nanhunter scan {cap})" in line
    messages = [r.getMessage() for r in caplog.records]
    assert (
        f"nanhunter: step {FAULT} went non-finite; its optimizer update was undone (on_fault='skip')"
        in messages
    )
    assert any(f"(replay it with: nanhunter scan {cap})" in n for n in cb.report.notes)
    assert not any("<that directory>" in n for n in cb.report.notes)


@pytest.mark.parametrize("nan_inf_filter", [True, False])
def test_logging_nan_inf_filter_hiding_the_loss_is_named(tmp_path, monkeypatch, caplog, nan_inf_filter):
    """issue 32 (8): with logging_nan_inf_filter=True (the Trainer's default) the logged loss of
    the failing step is the average of the finite ones — the callback says so and names the step;
    with the filter off the logged loss is NaN itself, and nothing more is said."""
    _sequential(monkeypatch)
    cb = NanHunterCallback(on_fault="skip")
    with caplog.at_level(logging.WARNING):
        trainer, _ = _train(tmp_path, True, cb, logging_nan_inf_filter=nan_inf_filter)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    said = [r.getMessage() for r in caplog.records if "logging_nan_inf_filter" in r.getMessage()]
    if nan_inf_filter:
        assert all(torch.isfinite(torch.tensor(x)) for x in logged)  # what the user sees: a clean curve
        assert said == [
            f"nanhunter: the loss of step {FAULT} was non-finite, and transformers' "
            "logging_nan_inf_filter (True by default) left it out of the logged 'loss', which averages "
            "the finite steps instead: the logs look healthy; "
            "TrainingArguments(logging_nan_inf_filter=False) logs it as it is"
        ]
    else:
        assert not all(torch.isfinite(torch.tensor(x)) for x in logged) and said == []


# -- evaluation (contract v1.4 run.eval) --------------------------------------------------------------

EVAL_BAD = 3  # the eval sample that is all token 0 (its RMSNorm divides by zero)


class EvalData(torch.utils.data.Dataset):
    def __init__(self, fault: bool):
        g = torch.Generator().manual_seed(5)
        self.rows = [torch.randint(1, 32, (8,), generator=g) for _ in range(6)]
        if fault:
            self.rows[EVAL_BAD] = torch.zeros(8, dtype=torch.long)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def _evaluate(tmp_path, fault, callback=None, nan_inf_filter=True):
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_eval_batch_size=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        logging_nan_inf_filter=nan_inf_filter,
    )
    trainer = Trainer(
        model=_model(), args=args, eval_dataset=EvalData(fault), callbacks=[callback] if callback else []
    )
    return trainer, trainer.evaluate(), trainer.predict(EvalData(fault))


def test_evaluate_counts_and_locates_the_nonfinite_eval_loss(tmp_path, caplog):
    """``Trainer.evaluate()`` on its own (no training): the one NaN eval sample (batch size 1: one loss per
    sample) is counted and located like a training fault, at the RMSNorm of layer 0; the filter that left it
    out of ``eval_loss`` is named; the metrics and predictions are bitwise those of a run without the callback;
    nothing stops or raises."""
    cb = NanHunterCallback(on_fault="raise", report_path=str(tmp_path / "nan-report.json"))
    with caplog.at_level(logging.WARNING):
        t1, metrics, pred = _evaluate(tmp_path / "a", True, cb)
    _, metrics0, pred0 = _evaluate(tmp_path / "b", True)
    clock = ("runtime", "per_second", "preparation_time")
    assert repr({k: v for k, v in metrics.items() if not k.endswith(clock)}) == repr(
        {k: v for k, v in metrics0.items() if not k.endswith(clock)}
    )  # repr: NaN equals NaN, floats exact
    assert (pred.predictions.view("int32") == pred0.predictions.view("int32")).all()  # bitwise, NaN included
    assert cb.report is None  # no training fault
    rep = cb.eval_report
    assert (
        rep.first_nonfinite.step == EVAL_BAD
        and rep.first_nonfinite.module == "model.layers.0.input_layernorm"
    )
    assert rep.first_nonfinite.op is not None and rep.diagnosis.cause == "division_by_zero"
    # evaluate() then predict(): 12 eval steps, the bad sample once in each loop; the first one located
    assert rep.run["eval"]["first_failed"] == EVAL_BAD and rep.run["eval"]["after_step"] is None
    assert cb.core.eval.as_run()["steps"] == 12 and cb.core.eval.as_run()["nonfinite_losses"] == 2
    # the eval report counts every loop (not only the first's), and report_path has it (training was finite)
    assert (rep.run["eval"]["steps"], rep.run["eval"]["nonfinite_losses"]) == (12, 2)
    written = json.loads((tmp_path / "nan-report.json").read_text())
    assert written["run"]["eval"]["nonfinite_losses"] == 2 and written["first_nonfinite"]["step"] == EVAL_BAD
    said = [r.getMessage() for r in caplog.records if "evaluation" in r.getMessage()]
    assert any(
        "1 non-finite eval loss value(s) in 6 eval step(s)" in m and f"first at eval step {EVAL_BAD}" in m
        for m in said
    ), said
    # transformers 5 filters the NaN out of eval_loss, and the line says so; 4.x reports eval_loss NaN itself
    hidden = math.isfinite(metrics["eval_loss"])
    assert any("logging_nan_inf_filter" in m for m in said) == hidden
    cb.close()
    assert not t1.model._forward_pre_hooks and not t1.model._forward_hooks


def test_evaluation_during_training_is_watched_apart_from_training(tmp_path, monkeypatch):
    """``eval_strategy="steps"``: the eval forwards are not training steps (the training watch is paused:
    no fault, no stop) and ``run.eval`` counts them; a clean training run keeps ``report`` None and trains
    bitwise as without the callback."""
    _sequential(monkeypatch)

    def train(path, callback):
        model = _model()
        args = TrainingArguments(
            output_dir=str(path),
            per_device_train_batch_size=2,
            per_device_eval_batch_size=1,
            max_steps=4,
            eval_strategy="steps",
            eval_steps=2,
            learning_rate=1e-2,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
            data_seed=0,
            dataloader_num_workers=0,
        )
        t = Trainer(
            model=model,
            args=args,
            train_dataset=Data(False),
            eval_dataset=EvalData(True),
            callbacks=[callback] if callback else [],
        )
        t.train()
        return t, model

    cb = NanHunterCallback()
    t1, m1 = train(tmp_path / "a", cb)
    t2, m2 = train(tmp_path / "b", None)
    assert t1.state.global_step == 4 and cb.report is None
    ev = cb.core.eval.as_run()
    assert (ev["steps"], ev["nonfinite_losses"], ev["first_failed"], ev["after_step"]) == (12, 2, EVAL_BAD, 2)
    assert (ev["module"], ev["cause"]) == ("model.layers.0.input_layernorm", "division_by_zero")
    for (n, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), n
    strip = [
        {k: v for k, v in h.items() if "runtime" not in k and "per_second" not in k}
        for h in t1.state.log_history
    ]
    assert repr(strip) == repr(
        [
            {k: v for k, v in h.items() if "runtime" not in k and "per_second" not in k}
            for h in t2.state.log_history
        ]
    )  # repr: a NaN eval_loss (transformers 4) equal
    assert not m1._forward_pre_hooks and not m1._forward_hooks  # training over: every hook gone
    cb.watch_evaluation(t1.model)  # evaluate() after train(): watched again, steps counted on
    t1.evaluate()
    ev = cb.core.eval.as_run()
    assert (ev["steps"], ev["nonfinite_losses"], ev["first_failed"]) == (18, 3, EVAL_BAD)
    cb.close()
    assert not m1._forward_pre_hooks and not m1._forward_hooks


def test_sampled_steps_log_the_forecast_as_scalars(tmp_path, monkeypatch):
    """issue 46: with steps sampled (``sample_every=1``) each log step of a clean run gains the
    ``nanhunter/`` scalars (the warning count, the forecast's top entries) in its ``log_history``
    entry; nothing else changes."""
    _sequential(monkeypatch)
    cb = NanHunterCallback(sample_every=1)
    trainer, _ = _train(tmp_path, False, cb)
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged and all(h.get("nanhunter/warnings") == 0.0 for h in logged)
    assert cb.report is None
