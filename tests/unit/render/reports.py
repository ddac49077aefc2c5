"""Reports as the pipeline gives them, built by hand for the views' unit tests (no model runs).

``overflow()`` is what ``nan_hunter.scan`` returns for the two-Linear model of tests/conftest.py
(``up`` → 4, ``down`` with weights 30000 → 480000: +inf in fp16), field for field; the others
are the weights-only, check and bisect reports of the same kind of checkpoint."""

from __future__ import annotations

import math

from nan_hunter.report import BisectResult, Diagnosis, FirstNonfinite, FixVerified, Report, RunInfo

CHECKPOINT = {"path": "model.safetensors", "format": "safetensors", "n_tensors": 4, "bytes": 160}


def _tensor(name: str, shape: list[int], absmax: float, nan: int = 0, posinf: int = 0, first=None) -> dict:
    return {
        "name": name,
        "dtype": "float32",
        "shape": shape,
        "numel": math.prod(shape),
        "nan": nan,
        "posinf": posinf,
        "neginf": 0,
        "first_index": first,
        "absmax": absmax,
        "min_nonzero": absmax or None,
        "overflows": {"fp16": False, "bf16": False, "fp8-e4m3": absmax > 448, "fp8-e5m2": False},
        "headroom": {
            "fp16": 65504 / absmax if absmax else None,
            "bf16": None,
            "fp8-e4m3": 448 / absmax if absmax else None,
            "fp8-e5m2": 57344 / absmax if absmax else None,
        },
        "fp16_zero_frac": 0.0,
        "fp16_subnormal_frac": 0.0,
        "sampled": False,
        "skipped": None,
        "unchecked": False,
    }


def _weights(nonfinite: list[dict] | None = None) -> dict:
    """The weights block; a tensor in ``nonfinite`` replaces its clean row in ``tensors`` too."""
    bad = {t["name"]: t for t in nonfinite or []}
    tensors = [
        bad.get(t["name"], t)
        for t in (
            _tensor("down.bias", [4], 0.0),
            _tensor("down.weight", [4, 4], 30000.0),
            _tensor("up.bias", [4], 0.0),
            _tensor("up.weight", [4, 4], 1.0),
        )
    ]
    return {
        "n_tensors": 4,
        "nonfinite": nonfinite or [],
        "n_skipped": 0,
        "near_overflow": [
            {
                "name": "down.weight",
                "dtype": "float32",
                "absmax": 30000.0,
                "overflows": ["fp8-e4m3"],
                "headroom": {"fp8-e4m3": 448 / 30000, "fp8-e5m2": 57344 / 30000},
            }
        ],
        "fp16_underflow": [],
        "underflow_sampled": False,
        "tensors": tensors,
    }


def _module(
    name: str, module_type: str, depth: int, absmax: float, in_absmax: float, posinf: int = 0
) -> dict:
    return {
        "module": name,
        "module_type": module_type,
        "call_index": 0,
        "input_index": 0,
        "depth": depth,
        "absmax": absmax,
        "in_absmax": in_absmax,
        "nan": 0,
        "posinf": posinf,
        "neginf": 0,
        "min_nonzero": absmax if absmax and not posinf else None,
        "subnormal_frac": None if absmax else 0.0,
        "flush_frac": {"fp16": 0.0, "bf16": 0.0, "fp8-e4m3": 0.0, "fp8-e5m2": 0.0},
    }


def _replay_row(finite: bool, absmax: float | None, rel_err: float | None, posinf: int = 0) -> dict:
    return {"finite": finite, "nan": 0, "posinf": posinf, "neginf": 0, "absmax": absmax, "rel_err": rel_err}


def overflow() -> Report:
    """The fp16 scan of the two-Linear model: ``down``'s addmm overflows, verified fix, replay."""
    fix = (
        "Keep down in fp32 (`nanhunter bisect --dtype fp16` finds the smallest such set; transformers' "
        "_keep_in_fp32_modules), or run in bf16. Verified: keep down in fp32 (apply_policy) makes the failing "
        "input finite, max rel err 0 vs fp32."
    )
    diag = Diagnosis(
        "overflow",
        "fp16",
        "down",
        "aten.addmm.default",
        "matmul overflow in fp16 at aten.addmm.default in down",
        [
            "absmax 4.8e+05 > fp16 max 65504 at aten.addmm.default in down (the op re-run in float64 "
            "from its operands)",
            "operands, all finite: #0 float16[4] absmax 0, #1 float16[2, 4] absmax 4, #2 float16[4, 4] "
            "absmax 3e+04",
            "replay: finite in fp32, bf16, fp8-e4m3, fp8-e5m2; non-finite in fp16",
        ],
        fix,
        FixVerified("keep down in fp32 (apply_policy)", True, 0.0, "model", "fp32"),
    )
    source = "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py:134  return F.linear(input, self.weight, self.bias)"
    return Report(
        checkpoint=dict(CHECKPOINT),
        weights=_weights(),
        run=RunInfo("fp16", "cpu", 1, [0], compute_dtype="fp16", inputs=["inputs.safetensors"]),
        first_nonfinite=FirstNonfinite(
            0, "down", "Linear", "aten.addmm.default", "posinf", "producer", 0, source, "out"
        ),
        replay={
            "fp32": _replay_row(True, 480000.0, 0.0),
            "bf16": _replay_row(True, 479232.0, 0.0016),
            "fp16": _replay_row(False, None, None, posinf=8),
            "fp8-e4m3": _replay_row(True, 479232.0, 0.0016),
            "fp8-e5m2": _replay_row(True, 479232.0, 0.0016),
            "fp64": _replay_row(True, 480000.0, 0.0),
        },
        diagnosis=diag,
        modules=[
            _module("up", "Linear", 1, 4.0, 1.0),
            _module("down", "Linear", 1, 0.0, 4.0, posinf=8),
            _module("", "Sequential", 0, 0.0, 1.0, posinf=8),
        ],
        inputs=[{"index": 0, "label": "inputs.safetensors", "finite": False, "text": None}],
    )


def clean() -> Report:
    """The same model in fp32: every call finite."""
    return Report(
        checkpoint=dict(CHECKPOINT),
        weights=_weights(),
        run=RunInfo("fp32", "cpu", 1, [], compute_dtype="fp32", inputs=["inputs.safetensors"]),
        modules=[
            _module("up", "Linear", 1, 4.0, 1.0),
            _module("down", "Linear", 1, 480000.0, 4.0),
            _module("", "Sequential", 0, 480000.0, 1.0),
        ],
        inputs=[{"index": 0, "label": "inputs.safetensors", "finite": True, "text": None}],
    )


def nan_weights() -> Report:
    """A weights-only scan (no model) of a checkpoint whose ``up.weight`` holds one NaN at [1, 2]."""
    bad = _tensor("up.weight", [4, 4], 1.0, nan=1, first=[1, 2])
    diag = Diagnosis(
        "nonfinite_weights",
        None,
        None,
        None,
        "1 of 4 floating tensors hold NaN/Inf: up.weight",
        ["up.weight: 1 NaN, 0 +inf, 0 −inf, first at [1, 2]"],
        "Re-export the checkpoint from a good copy; the NaN was written into the file.",
    )
    return Report(checkpoint=dict(CHECKPOINT), weights=_weights([bad]), diagnosis=diag)


def _result(
    rule: str,
    status: str,
    message: str,
    dtype: str | None = "fp16",
    value: float | None = None,
    path: str = "model.safetensors",
) -> dict:
    return {
        "rule": rule,
        "checkpoint": path,
        "status": status,
        "message": message,
        "dtype": dtype,
        "value": value,
        "details": [],
    }


def check(passed: bool, path: str = "model.safetensors") -> Report:
    """``nanhunter check`` of one checkpoint, weights only: all rules pass, or the NaN fails one and
    fp16 headroom warns."""
    if passed:
        results = [
            _result("weights.nonfinite", "pass", "4 floating tensors, none holds NaN/Inf", None, path=path),
            _result(
                "weights.headroom.fp16",
                "pass",
                "absmax 3e+04 is 46% of fp16 max 65504",
                value=0.46,
                path=path,
            ),
            _result("weights.headroom.bf16", "pass", "absmax 3e+04 is 0% of bf16 max", "bf16", 0.0, path),
        ]
    else:
        results = [
            _result(
                "weights.nonfinite",
                "fail",
                "1 of 4 floating tensors hold NaN/Inf: up.weight (1 NaN, 0 +inf, 0 −inf, first at [1, 2])",
                None,
                path=path,
            ),
            _result(
                "weights.headroom.fp16",
                "warn",
                "absmax 3e+04 is 46% of fp16 max 65504",
                value=0.46,
                path=path,
            ),
            _result("weights.headroom.bf16", "pass", "absmax 3e+04 is 0% of bf16 max", "bf16", 0.0, path),
        ]
    return Report(
        checkpoint={**CHECKPOINT, "path": path},
        weights=_weights(),
        mode="check",
        check={"passed": passed, "dtypes": ["fp16", "bf16"], "results": results, "runs": {}},
    )


def bisect() -> Report:
    """``nanhunter bisect --dtype fp16`` of the model: keep ``down`` in fp32."""
    return Report(
        checkpoint=dict(CHECKPOINT),
        run=RunInfo("fp16", "cpu", 1, [0]),
        mode="bisect",
        bisect=BisectResult("fp16", "fp32", ["down"], 4, True, 0.0, candidates=2, bound=2),
    )
