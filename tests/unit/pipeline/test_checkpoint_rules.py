"""check on quantized, suspicious and unchecked weights, and check --baseline OLD
(rule headroom_regression.<dtype>, JUnit testcase, JSON baseline block, GitHub annotation)."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.config import default_config
from nan_hunter.pipeline.checkpoint_rules import headroom_db
from nan_hunter.pipeline.ci_check import check, passed
from nan_hunter.render.ci import annotations, render_junit
from nan_hunter.render.rows import verdict


def _save(path, **tensors):
    save_file(tensors, str(path))
    return str(path)


def _rules(rep):
    return {r["rule"]: r for r in rep.check["results"]}


def test_default_floor_is_20_db():
    assert default_config().check.min_headroom_db == 20


def test_retired_drop_key_is_refused_naming_the_floor(tmp_path):
    from nan_hunter.config import load_config
    from nan_hunter.errors import BadInput

    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_headroom_drop_db: 20\n")
    with pytest.raises(BadInput, match="min_headroom_db"):
        load_config(cfg)


def test_baseline_regression_fails_with_both_headrooms(tmp_path):
    old = _save(
        tmp_path / "old.safetensors",
        **{"mlp.down_proj.weight": torch.full((4, 4), 16.4), "mlp.up_proj.weight": torch.full((4, 4), 1.0)},
    )
    # down_proj: 65504/16.4 = 72 dB -> 65504/40000 = 4.3 dB (fell 67 dB); up_proj unchanged
    new = _save(
        tmp_path / "new.safetensors",
        **{
            "mlp.down_proj.weight": torch.full((4, 4), 40000.0),
            "mlp.up_proj.weight": torch.full((4, 4), 1.0),
            "only.new": torch.ones(2),
        },
    )
    [rep] = check([new], dtypes="fp16,bf16", baseline=old)
    r = _rules(rep)
    assert r["headroom_regression.fp16"]["status"] == "fail"
    # 67 dB less in bf16 too, but 40000 leaves 639 dB of bf16 headroom: far inside the range
    assert r["headroom_regression.bf16"]["status"] == "pass"
    assert rep.baseline["path"] == old and rep.baseline["compared"] == 2
    assert {x["dtype"] for x in rep.baseline["regressions"]} == {"fp16"}
    reg = rep.baseline["regressions"]
    assert [x["name"] for x in reg] == ["mlp.down_proj.weight"]
    assert math.isclose(reg[0]["old_headroom"], headroom_db(float(torch.tensor(16.4)), "fp16"))
    assert math.isclose(reg[0]["new_headroom"], 20 * math.log10(65504 / 40000))
    assert set(reg[0]) == {"name", "dtype", "old_absmax", "new_absmax", "old_headroom", "new_headroom"}
    assert not passed([rep]) and rep.exit_code() == 1
    junit = render_junit([rep])
    assert 'name="headroom_regression.fp16"' in junit and "<failure" in junit
    ann = [a for a in annotations([rep]) if "headroom_regression.fp16" in a][0]
    assert "mlp.down_proj.weight" in ann and "72.0 dB" in ann and "4.3 dB" in ann
    assert rep.to_dict()["baseline"]["compared"] == 2


@pytest.mark.parametrize(
    "dtype, old_absmax, new_absmax, status",
    [
        # issue 31 (5): a 10x (here 18000x) growth that stays far inside bf16 was a false alarm
        ("bf16", 4.1, 7.5e4, "pass"),
        ("fp16", 1.0, 1000.0, "pass"),  # 96.3 dB -> 36.3 dB: a 60 dB fall, still above the 20 dB floor
        ("fp16", 100.0, 10000.0, "fail"),  # 56.3 dB -> 16.3 dB: crossed the floor
        ("fp16", 10000.0, 20000.0, "pass"),  # 16.3 -> 10.3 dB: already under the floor (weights.headroom's)
        ("fp16", 60000.0, 70000.0, "fail"),  # fit, now overflows
        ("bf16", 3e37, 4e37, "fail"),  # 21.1 dB -> 18.6 dB: crossed the floor, in bf16 too
        ("fp16", 0.0, 10000.0, "fail"),  # all zero (unbounded headroom) -> 16.3 dB
    ],
)
def test_baseline_fails_only_below_the_floor_or_on_overflow(tmp_path, dtype, old_absmax, new_absmax, status):
    old = _save(tmp_path / "old.safetensors", w=torch.full((2, 2), old_absmax))
    new = _save(tmp_path / "new.safetensors", w=torch.full((2, 2), new_absmax))
    [rep] = check([new], dtypes=dtype, baseline=old)
    rule = _rules(rep)[f"headroom_regression.{dtype}"]
    assert rule["status"] == status, rule["message"]
    assert bool(rep.baseline["regressions"]) == (status == "fail")


def test_bf16_false_alarm_message_of_issue_31(tmp_path):
    old = _save(tmp_path / "old.safetensors", w=torch.full((2, 2), 4.1))
    new = _save(tmp_path / "new.safetensors", w=torch.full((2, 2), 7.5e4))
    [rep] = check([new], dtypes="bf16", baseline=old)
    rule = _rules(rep)["headroom_regression.bf16"]
    assert rule["status"] == "pass" and "20 dB" in rule["message"]
    assert passed([rep]) and rep.exit_code() == 0


def test_floor_comes_from_the_config(tmp_path):
    old = _save(tmp_path / "old.safetensors", w=torch.full((2, 2), 1.0))
    new = _save(tmp_path / "new.safetensors", w=torch.full((2, 2), 1000.0))  # 36.3 dB of fp16 headroom left
    cfg = tmp_path / "c.yaml"
    cfg.write_text("min_headroom_db: 40\n")
    [rep] = check([new], dtypes="fp16", baseline=old, config=str(cfg))
    rule = _rules(rep)["headroom_regression.fp16"]
    assert rule["status"] == "fail" and "below the 40 dB floor" in rule["message"]


def test_baseline_small_drop_passes_and_overflow_fails(tmp_path):
    old = _save(tmp_path / "old.safetensors", w=torch.full((2, 2), 100.0))
    new = _save(tmp_path / "new.safetensors", w=torch.full((2, 2), 300.0))  # 9.5 dB less
    [rep] = check([new], dtypes="fp16", baseline=old)
    assert _rules(rep)["headroom_regression.fp16"]["status"] == "pass" and rep.baseline["regressions"] == []
    # fit fp16 before (60000), overflows now (70000): a drop of 1.3 dB, still a regression
    old = _save(tmp_path / "old2.safetensors", w=torch.full((2, 2), 60000.0))
    new = _save(tmp_path / "new2.safetensors", w=torch.full((2, 2), 70000.0))
    cfg = default_config()
    [rep] = check([new], dtypes="fp16", baseline=old, config=cfg)
    assert _rules(rep)["headroom_regression.fp16"]["status"] == "fail"
    assert "now overflows" in _rules(rep)["headroom_regression.fp16"]["message"]


def test_check_fails_on_bad_scale_and_warns_on_suspicious_and_unchecked(tmp_path):
    w = torch.ones(128, 128).to(torch.float8_e4m3fn)
    s = torch.tensor([[0.0]])  # a zero scale on a block holding data
    p = _save(
        tmp_path / "q.safetensors",
        **{
            "l.weight": w,
            "l.weight_scale_inv": s,
            "z.weight": torch.zeros(3, 3),
            "u.weight": torch.full((2,), 3e33),
            "c": torch.zeros(2, dtype=torch.complex64),
        },
    )
    [rep] = check([p], dtypes="fp16")
    r = _rules(rep)
    assert r["weights.quantized"]["status"] == "fail" and "zero" in r["weights.quantized"]["message"]
    assert r["weights.suspicious"]["status"] == "warn" and "z.weight" in r["weights.suspicious"]["message"]
    assert {s["name"]: s["reason"] for s in rep.weights["suspicious"]} == {
        "z.weight": "all_zero",
        "u.weight": "huge",
    }
    assert r["weights.unchecked"]["status"] == "warn"
    assert rep.diagnosis.cause == "bad_scale" and rep.exit_code() == 1


def test_suspicious_alone_is_a_note(tmp_path):
    from nan_hunter.pipeline.scan_checkpoint import scan

    p = _save(tmp_path / "s.safetensors", **{"z.weight": torch.zeros(3, 3), "bias": torch.zeros(3)})
    rep = scan(p)
    assert rep.weights["suspicious"] == [{"name": "z.weight", "reason": "all_zero", "absmax": 0.0}]
    assert rep.exit_code() == 0 and "1 suspicious" in verdict(rep).text
