"""render/ci.py: ``check`` results as JUnit XML (one suite per checkpoint, one case per rule) and
as GitHub Actions workflow commands (failing and warning rules only, one line each)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from nan_hunter.render.ci import annotations, render_junit, write_junit

from .reports import check


def test_junit_counts_and_one_suite_per_checkpoint():
    reps = [check(True, "a.safetensors"), check(False, "b.safetensors")]
    root = ET.fromstring(render_junit(reps).split("\n", 1)[1])
    assert (root.tag, root.get("tests"), root.get("failures"), root.get("skipped")) == (
        "testsuites",
        "6",
        "1",
        "1",
    )
    a, b = root.findall("testsuite")
    assert (a.get("name"), a.get("failures"), b.get("name"), b.get("failures")) == (
        "a.safetensors",
        "0",
        "b.safetensors",
        "1",
    )
    assert [c.get("name") for c in b.iter("testcase")] == [
        "weights.nonfinite",
        "weights.headroom.fp16",
        "weights.headroom.bf16",
    ]
    assert {p.get("name"): p.get("value") for p in b.iter("property")} == {
        "dtypes": "fp16,bf16",
        "forward": "no (weights only)",
    }


@pytest.mark.parametrize(
    "rule, element, message",
    [
        ("weights.nonfinite", "failure", "1 of 4 floating tensors hold NaN/Inf: up.weight"),
        (
            "weights.headroom.fp16",
            "skipped",
            "warning: absmax 3e+04 is 46% of fp16 max 65504",
        ),  # warn shows yellow
        ("weights.headroom.bf16", None, None),  # a pass: only system-out
    ],
)
def test_junit_case_per_status(rule, element, message):
    root = ET.fromstring(render_junit([check(False)]).split("\n", 1)[1])
    case = next(c for c in root.iter("testcase") if c.get("name") == rule)
    kids = {k.tag for k in case} - {"system-out"}
    assert kids == ({element} if element else set())
    if element:
        assert case.find(element).get("message").startswith(message)
    assert case.find("system-out").text.split(":")[0] in ("FAIL", "WARN", "PASS")


def test_junit_is_a_declared_utf8_document():
    text = render_junit([check(True)])
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites') and text.endswith("\n")


def test_annotations_for_failures_and_warnings_only():
    assert annotations([check(True)]) == []
    assert annotations([check(False, "b.safetensors")]) == [
        "::error file=b.safetensors,title=nanhunter weights.nonfinite::1 of 4 floating tensors hold NaN/Inf: up.weight "
        "(1 NaN, 0 +inf, 0 −inf, first at [1, 2])",
        # the toolkit's encoding: a % in a message is %25
        "::warning file=b.safetensors,title=nanhunter weights.headroom.fp16::absmax 3e+04 is 46%25 of fp16 max 65504",
    ]


def test_annotation_properties_are_escaped():
    """A ``,`` or ``:`` in a checkpoint path would end the property early: percent-encoded."""
    line = annotations([check(False, "dir,x:y/m.safetensors")])[0]
    assert line.startswith("::error file=dir%2Cx%3Ay/m.safetensors,title=")


def test_write_junit_writes_the_rendered_text(tmp_path):
    reps = [check(False)]
    write_junit(reps, str(tmp_path / "j.xml"))
    assert (tmp_path / "j.xml").read_text(encoding="utf-8") == render_junit(reps)
