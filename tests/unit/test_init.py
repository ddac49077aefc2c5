"""nan_hunter/__init__.py: the public API — keywords with the flags' names, a mistyped one a
``TypeError`` naming the one meant (the CLI's suggestions; ``no_replay`` → ``replay=False``; an
output flag → the report's method), ``Report`` loaded on first use, torch imported only when
called. (Signatures against the CLI's flags: tests/integration/test_api_signatures.py.)"""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import save_file

import nan_hunter
from nan_hunter.render.report_view import PrintableReport


def _ck(tmp_path, value: float = 1.0) -> str:
    save_file({"w": torch.full((4,), value)}, str(tmp_path / "w.safetensors"))
    return str(tmp_path / "w.safetensors")


@pytest.mark.parametrize(
    "fn, kw, hint",
    [
        ("scan", "prompt", "did you mean prompts=?"),
        ("scan", "precision", "did you mean dtype=?"),  # the project's synonym
        ("scan", "no_replay", "use replay=False"),
        ("scan", "json", "scan() returns the report: write it with report.to_json(path)"),
        ("bisect", "html", "bisect() returns the report: write it with report.to_html(path)"),
        ("bisect", "quiet", "bisect() returns the report: print(report) shows the terminal view"),
        ("diff", "zzzz", "its keywords are a, b, rtol, fail_on"),
        ("watch", "levl", "did you mean level=?"),
    ],
)
def test_a_mistyped_keyword_names_the_one_meant(fn, kw, hint):
    with pytest.raises(TypeError) as e:
        getattr(nan_hunter, fn)("x", **{kw: 1})
    assert str(e.value) == f"{fn}() got an unexpected keyword argument {kw!r}; {hint}"


def test_the_wrapped_functions_keep_their_signatures_and_docs():
    import inspect

    assert list(inspect.signature(nan_hunter.scan).parameters)[:3] == ["checkpoint", "arch", "attn"]
    assert nan_hunter.scan.__doc__.startswith("``nanhunter scan CHECKPOINT`` as a function")


def test_scan_returns_a_printable_report(tmp_path):
    rep = nan_hunter.scan(_ck(tmp_path, float("nan")))
    assert isinstance(rep, PrintableReport) and rep.exit_code() == 1
    assert re.search(r"^✘ nonfinite_weights", str(rep), re.M)


def test_report_is_the_data_class():
    from nan_hunter.report import Report

    assert nan_hunter.Report is Report and "Report" in nan_hunter.__all__


def test_unknown_attributes_are_attribute_errors():
    with pytest.raises(AttributeError, match="nothing_here"):
        nan_hunter.nothing_here  # noqa: B018


def test_apply_policy_keeps_a_module_in_its_dtype():
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)).half()
    nan_hunter.apply_policy(m, {"dtype": "fp16", "modules": {"1": "fp32"}})
    assert m[1].weight.dtype == torch.float32 and m[0].weight.dtype == torch.float16


def test_check_returns_one_printable_report_per_checkpoint(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    bad, good = _ck(tmp_path / "a", float("nan")), _ck(tmp_path / "b")
    reps = nan_hunter.check([bad, good], dtypes="fp16")
    assert [type(r) for r in reps] == [PrintableReport, PrintableReport]
    assert [r.check["passed"] for r in reps] == [False, True]
    assert nan_hunter.check(good)[0].check["dtypes"] == [
        "fp16",
        "bf16",
    ]  # a single path is one; the policy's dtypes
    with pytest.raises(TypeError, match="did you mean prompts=?"):
        nan_hunter.check(good, prompt="hi")
