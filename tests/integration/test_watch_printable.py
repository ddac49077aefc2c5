"""A watch report people can use: ``print(rep)`` shows the terminal view, ``to_html``/``to_json``
write the CLI's reports, with the replay matrix and the verified fix; ``watch``'s signature."""

from __future__ import annotations

import inspect
import json

import torch

import nan_hunter
from nan_hunter.render.rows import VERDICT_WIDTH, cells


def _overflowing_report():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).half()
    with torch.no_grad():
        m[0].weight.fill_(1.0)
        m[2].weight.fill_(30000.0)
    with nan_hunter.watch(m) as w:
        m(torch.full((2, 4), 3.0, dtype=torch.float16))
    return w.report()


def test_print_json_and_html(tmp_path, capsys):
    rep = _overflowing_report()
    print(rep)
    out = capsys.readouterr().out
    assert "✘ overflow: +inf first produced by 2 at aten.addmm (fp16)" in out
    assert "replay of the failing region" in out
    # the watch kept the failing step's input: the fix is checked on a fresh copy of the whole model
    # (contract v1.4 scope "model"; under autocast it stays "region": test_watch_fix_scope.py)
    assert "✔ verified on a copy of the whole model: keep 2 in fp32 (apply_policy)" in out
    text80 = rep.render(80)
    assert all(cells(line) <= 80 for line in text80.splitlines())
    rep.to_json(str(tmp_path / "r.json"))
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["schema"] == "nanhunter.report/v1" and d["first_nonfinite"]["module"] == "2"
    assert d["replay"]["fp16"]["finite"] is False and d["replay"]["bf16"]["finite"] is True
    fv = d["diagnosis"]["fix_verified"]
    assert fv["max_rel_err"] < 0.05 and {k: v for k, v in fv.items() if k != "max_rel_err"} == {
        "change": "keep 2 in fp32 (apply_policy)",
        "finite": True,
        "scope": "model",
        "reference": "fp32",
        "applied_as": {"kind": "policy", "policy": {"2": "fp32"}, "dtype": "fp16", "option": None},
    }
    rep.to_html(str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert "verified on a copy of the whole model" in page and "replay" in page
    assert rep["replay"]["fp16"]["posinf"] == 4  # keys, as the JSON report


def test_clean_watch_prints_one_verdict():
    m = torch.nn.Linear(3, 3)
    with nan_hunter.watch(m) as w:
        m(torch.ones(1, 3))
    text = w.report().render(80)
    assert (
        text.strip().splitlines()[-1] == "✔ no NaN/Inf found" and cells("✔ no NaN/Inf found") <= VERDICT_WIDTH
    )


def test_watch_signature_is_typed_and_documented():
    sig = inspect.signature(nan_hunter.watch)
    for name in (
        "level",
        "retain",
        "dtype",
        "backward",
        "optimizer",
        "scaler",
        "capsule_dir",
        "arch",
        "on_fault",
    ):
        assert name in sig.parameters and name in nan_hunter.watch.__doc__
    assert sig.parameters["on_fault"].default == "record"
    assert not any(
        p.kind is p.VAR_KEYWORD for p in sig.parameters.values()
    )  # every option named, none swallowed


def _skipping_run(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with nan_hunter.watch(
        m, backward=True, optimizer=opt, on_fault="skip", capsule_dir=str(tmp_path / "caps")
    ) as w:
        for step in range(6):
            x = torch.ones(2, 4)
            if step in (3, 5):
                x[0, 0] = float("inf")
            opt.zero_grad()
            m(x).sum().backward()
            opt.step()
    return w.report()


def test_training_report_names_steps_and_shows_skipped_ones(tmp_path, caplog):
    """issue 32 (4): a watched training run counts steps, not inputs ("step 3 · forward"); the steps
    on_fault="skip" undid are logged as they happen and shown by print(report); the capsule note
    gives the command that replays it."""
    import logging

    with caplog.at_level(logging.WARNING, logger="nan_hunter"):
        rep = _skipping_run(tmp_path)
    text = rep.render(80)
    assert "input #" not in text
    assert "value  posinf · role input · step 3 · forward" in text
    assert "skipped   step(s) 3, 5: non-finite, their updates undone (on_fault='skip')" in text
    assert (
        text.splitlines()[-1]
        == "✘ nonfinite_input: +inf in the input data, first reaching 0 (step 3 · forward)"
    )
    said = [r.getMessage() for r in caplog.records]
    cap = tmp_path / "caps" / "step-3"
    assert said == [
        f"nanhunter: wrote the capsule of step 3 to {cap} (replay it with: nanhunter scan {cap})",
        "nanhunter: step 3 went non-finite; its optimizer update was undone (on_fault='skip')",
        "nanhunter: step 5 went non-finite; its optimizer update was undone (on_fault='skip')",
    ]
    assert f"capsule of the failing step written to {cap} (replay it with: nanhunter scan {cap})" in rep.notes
