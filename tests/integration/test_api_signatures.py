"""One Python API: ``nan_hunter.scan`` and ``bisect`` take the flags' names as documented keywords,
refuse a mistyped one with the keyword meant (as the CLI suggests the flag), and return reports
that print, ``to_html`` and ``to_json`` as watch reports do."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

import nan_hunter
from nan_hunter.bisection.options import BisectOptions
from nan_hunter.options import option_fields
from nan_hunter.pipeline.options import ScanOptions
from nan_hunter.report import Report

ROOT = Path(__file__).resolve().parents[2]
TINY_LLAMA = str(ROOT / "examples" / "tiny-llama-fp16")

#: every flag of the command, as the keyword that takes its value: the option fields (a repeatable
#: flag: plural; --no-replay: replay=False), held against the signature both ways by tests/unit/test_options.py
SCAN_KEYWORDS = {f.name for f, _ in option_fields(ScanOptions)} | {"config"}
BISECT_KEYWORDS = {f.name for f, _ in option_fields(BisectOptions)} | {"config"}


@pytest.mark.parametrize(
    "fn, keywords", [(nan_hunter.scan, SCAN_KEYWORDS), (nan_hunter.bisect, BISECT_KEYWORDS)]
)
def test_real_keyword_signature_documented(fn, keywords):
    params = inspect.signature(fn).parameters
    assert list(params)[0] == "checkpoint"
    assert keywords <= set(params), keywords - set(params)
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in keywords)
    doc = inspect.getdoc(fn)
    documented = set(re.findall(r"^ {4}([a-z_]+(?:, [a-z_]+)*):", doc, flags=re.M))
    names = {n for group in documented for n in group.split(", ")}
    assert keywords <= names, keywords - names


@pytest.mark.parametrize(
    "call, says",
    [
        (
            lambda: nan_hunter.scan("x", prompt="hi"),
            "got an unexpected keyword argument 'prompt'; did you mean prompts=?",
        ),
        (lambda: nan_hunter.scan("x", precision="fp16"), "did you mean dtype=?"),
        (lambda: nan_hunter.scan("x", dtpye="fp16"), "did you mean dtype=?"),
        (lambda: nan_hunter.scan("x", no_replay=True), "use replay=False"),
        (lambda: nan_hunter.scan("x", json="r.json"), "write it with report.to_json(path)"),
        (lambda: nan_hunter.bisect("x", keep_dtpye="bf16"), "did you mean keep_dtype=?"),
        (lambda: nan_hunter.bisect("x", policy="p.yaml"), "did you mean policy_out=?"),
        (lambda: nan_hunter.watch(object(), levle="ops"), "did you mean level=?"),
    ],
)
def test_mistyped_keyword_names_the_one_meant(call, says):
    with pytest.raises(TypeError) as e:
        call()
    assert says in str(e.value)


def test_watch_docstring_documents_every_option_and_no_contract_version():
    doc = inspect.getdoc(nan_hunter.watch)
    for name in list(inspect.signature(nan_hunter.watch).parameters):
        assert re.search(rf"^ {{4}}{name}:", doc, flags=re.M), name
    assert '"ops"' in doc and '"blocks"' in doc and '"modules"' in doc
    assert not re.search(r"contract v\d", doc)


@pytest.fixture(scope="module")
def failing_scan() -> Report:
    return nan_hunter.scan(TINY_LLAMA, prompts="the quick brown fox", dtype="fp16", device="cpu")


def test_scan_report_prints_as_the_cli_shows_it(failing_scan):
    rep = failing_scan
    assert rep.exit_code() == 1
    text = rep.render(width=80)
    lines = text.splitlines()
    assert lines[-1].startswith("✘ overflow") and all(len(line) <= 80 for line in lines)
    assert "first non-finite value" in text and "diagnosis" in text
    assert str(rep).splitlines()[-1] == lines[-1]


def test_scan_report_to_html_and_to_json(failing_scan, tmp_path):
    failing_scan.to_html(str(tmp_path / "r.html"))
    failing_scan.to_json(str(tmp_path / "r.json"))
    assert (tmp_path / "r.html").read_text().lstrip().lower().startswith("<!doctype html")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema"] == "nanhunter.report/v1" and data["first_nonfinite"]["kind"] == "posinf"


def test_bisect_report_prints(tmp_path):
    rep = nan_hunter.bisect(TINY_LLAMA, prompts="the quick brown fox", dtype="fp16", device="cpu")
    text = rep.render(width=100)
    assert rep.bisect is not None and "keep" in text.lower()
    rep.to_json(str(tmp_path / "b.json"))
    assert json.loads((tmp_path / "b.json").read_text())["bisect"]["keep_modules"] == rep.bisect.keep_modules
