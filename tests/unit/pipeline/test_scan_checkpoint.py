"""pipeline/scan_checkpoint.py: ``scan`` as a function — options validated before anything runs, the
weights scanned first, nothing run without a model (said in a note), a model that cannot be built
reported weights-only when the weights already hold the answer, a GGUF file weights-only, otherwise
the mode the options ask for, with the inputs' texts in the report."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.config import default_config
from nan_hunter.errors import BadInput
from nan_hunter.pipeline.options import ScanOptions
from nan_hunter.pipeline.scan_checkpoint import run_scan, scan


def _file(tmp_path, value: float = 1.0) -> str:
    save_file({"lin.weight": torch.full((4, 4), value)}, str(tmp_path / "w.safetensors"))
    return str(tmp_path / "w.safetensors")


def test_weights_only_without_a_model(tmp_path):
    rep = scan(_file(tmp_path))
    assert rep.run is None and rep.diagnosis is None and rep.exit_code() == 0
    assert rep.notes == ["weights-only scan: no --arch and no config.json, so nothing was run"]


def test_non_finite_weights_without_a_model(tmp_path):
    rep = scan(_file(tmp_path, float("nan")))
    assert rep.diagnosis.cause == "nonfinite_weights" and rep.exit_code() == 1


def test_a_model_run_in_the_asked_dtype(overflow_model):
    m = overflow_model
    rep = scan(m["ck"], arch=m["arch"], inputs=(m["inputs"],), dtype="fp16", replay=False)
    assert rep.run["dtype"] == "fp16" and rep.first_nonfinite.module == "down" and rep.replay is None
    assert rep.diagnosis.cause == "overflow" and rep.inputs[0]["text"] is None  # a file: no text


def test_options_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(BadInput, match="--stats 'exact'"):
        scan(str(tmp_path / "never-opened.safetensors"), stats="exact")


def test_a_model_that_cannot_be_built_is_refused_when_the_weights_say_nothing(tmp_path):
    arch = tmp_path / "arch.py"
    arch.write_text("def build():\n    raise RuntimeError('no such model')\n")
    with pytest.raises(BadInput, match="no such model"):
        scan(_file(tmp_path), arch=f"{arch}:build", inputs=(_file(tmp_path),))


def test_but_reported_weights_only_when_they_hold_the_answer(tmp_path):
    arch = tmp_path / "arch.py"
    arch.write_text("def build():\n    raise RuntimeError('no such model')\n")
    ck = _file(tmp_path, float("inf"))
    rep = scan(ck, arch=f"{arch}:build", inputs=(ck,))
    assert rep.diagnosis.cause == "nonfinite_weights" and rep.run is None
    assert rep.notes[0].startswith("weights-only scan: the model was not built (--arch")


def test_run_scan_takes_validated_options_and_a_configuration(tmp_path):
    rep = run_scan(ScanOptions(_file(tmp_path, float("nan"))), default_config())
    assert rep.weights["nonfinite"][0]["name"] == "lin.weight"


def test_gguf_is_weights_only(tmp_path):
    from ..load.test_gguf_file import F32, gguf

    p = tmp_path / "m.gguf"
    p.write_bytes(gguf([("w", [4], F32, torch.ones(4).numpy().tobytes())]))
    assert scan(str(p)).exit_code() == 0
    with pytest.raises(BadInput, match="a GGUF file is scanned weights-only"):
        scan(str(p), prompts=("hi",))
