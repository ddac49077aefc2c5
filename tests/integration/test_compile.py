"""``scan --compile``: eager against torch.compile on CPU (inductor builds C++ with gcc here).

The torchtitan miniature (examples/incidents/compile_rmsnorm_fp8, docs/incidents.md #3) through
the real CLI (in this process, ``cli_main``): compiled and eager part at ``layers.0`` (fusing
norm → fp8 quantisation), the variant turns that into a NaN only when compiled, and emulate_precision_casts closes both gaps.
A clean model exits 0; a model that fails eager but not compiled gets a note and its eager
diagnosis. Each inductor run compiles afresh (dynamo reset before and after; ~10-30 s on 2 cores): slow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MINI = ROOT / "examples/incidents/compile_rmsnorm_fp8"


def _scan(
    cli, factory: str, inputs: str | Path, *extra: object, checkpoint: str | Path = MINI / "model.safetensors"
):
    return cli(
        "scan",
        checkpoint,
        "--arch",
        f"{MINI / 'model.py'}:{factory}",
        "--inputs",
        inputs,
        "--dtype",
        "bf16",
        "--compile",
        "-q",
        *extra,
    )


def _assert_emulate_closes(r: dict) -> None:
    emu = r["compile"]["emulate_precision_casts"]
    assert emu == {"compiled_finite": True, "max_rel_err": emu["max_rel_err"]}
    assert emu["max_rel_err"] <= 1e-2
    d = r["diagnosis"]
    assert "emulate_precision_casts = True" in d["fix"]
    assert any("closes the gap" in e for e in d["evidence"]), d["evidence"]


@pytest.mark.slow
def test_miniature_parts_at_the_fused_block(cli_main):
    res = _scan(cli_main, "build", MINI / "inputs.safetensors")
    assert res.code == 1, res.stderr
    r = res.report
    c = r["compile"]
    assert c["backend"] == "inductor"
    assert c["eager_finite"] is True and c["compiled_finite"] is True
    assert c["max_rel_err"] > 1e-2  # bf16 rounding skipped inside the fused norm → quantise
    assert c["first_divergent_module"] == "layers.0"
    assert r["first_nonfinite"] is None  # eager is fine
    d = r["diagnosis"]
    assert d["cause"] == "compile_divergence" and d["module"] == "layers.0"
    assert any("layers.0.norm, layers.0.proj match eager" in e for e in d["evidence"]), d["evidence"]
    _assert_emulate_closes(r)


@pytest.mark.slow
def test_variant_is_nan_only_when_compiled(cli_main):
    res = _scan(cli_main, "build_nan", MINI / "inputs_nan.safetensors")
    assert res.code == 1, res.stderr
    r = res.report
    c = r["compile"]
    assert c["eager_finite"] is True and c["compiled_finite"] is False
    assert c["first_divergent_module"] == "layers.0"
    assert r["first_nonfinite"] is None and r["run"]["failed_inputs"] == []
    d = r["diagnosis"]
    assert d["cause"] == "compile_divergence"
    assert "non-finite (nan)" in d["evidence"][0]
    _assert_emulate_closes(r)


@pytest.mark.slow
def test_clean_model_under_compile_exits_0(cli_main, overflow_model):
    res = cli_main(
        "scan",
        overflow_model["ck"],
        "--arch",
        overflow_model["arch"],
        "--inputs",
        overflow_model["inputs"],
        "--dtype",
        "fp32",
        "--compile",
        "-q",
    )
    assert res.code == 0, res.stderr
    c = res.report["compile"]
    assert c["eager_finite"] and c["compiled_finite"]
    assert c["first_divergent_module"] is None and c["emulate_precision_casts"] is None
    assert c["max_rel_err"] is not None and c["max_rel_err"] <= 1e-2
    assert res.report["diagnosis"] is None


def test_eager_backend_matches_eager_exactly(cli_main):
    """Backend "eager" runs dynamo's captured graph with the original ops: bit-identical, exit 0."""
    res = _scan(cli_main, "build", MINI / "inputs.safetensors", "--compile-backend", "eager")
    assert res.code == 0, res.stderr
    c = res.report["compile"]
    assert c["backend"] == "eager" and c["max_rel_err"] == 0.0
    assert c["first_divergent_module"] is None and c["emulate_precision_casts"] is None


@pytest.fixture(scope="module")
def eager_nan_case(tmp_path_factory) -> dict[str, Path]:
    """The variant with norm gain 1.5 and a row that quantises to a constant only in EAGER:
    eager makes 0/0 in layers.0.quant, compiled stays finite."""
    import torch
    from safetensors.torch import load_file, save_file

    tmp = tmp_path_factory.mktemp("eager_nan")
    sd = load_file(str(MINI / "model.safetensors"))
    sd["layers.0.norm.weight"] = torch.full_like(sd["layers.0.norm.weight"], 1.5)
    save_file(sd, str(tmp / "model.safetensors"))
    x = load_file(str(MINI / "inputs.safetensors"))["x"].clone()
    x[0] = 0.96484375
    x[0, :11] = 1.0
    save_file({"x": x}, str(tmp / "inputs.safetensors"))
    return {"ck": tmp / "model.safetensors", "inputs": tmp / "inputs.safetensors"}


@pytest.mark.slow
def test_compiled_finite_where_eager_is_not_is_a_note(cli_main, eager_nan_case):
    res = _scan(cli_main, "build_nan", eager_nan_case["inputs"], checkpoint=eager_nan_case["ck"])
    assert res.code == 1, res.stderr
    r = res.report
    c = r["compile"]
    assert c["eager_finite"] is False and c["compiled_finite"] is True
    assert c["first_divergent_module"] == "layers.0"
    # the eager fault is diagnosed as usual
    assert r["first_nonfinite"]["module"] == "layers.0.quant"
    assert r["diagnosis"]["cause"] != "compile_divergence"
    assert any("stays finite where eager does not" in n and "layers.0" in n for n in r["notes"]), r["notes"]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--compile-backend", "tvm"], "--compile-backend"),
        (["--rtol", "0"], "--rtol"),
        (["--dtype", "fp8-e4m3"], "fp8"),
    ],
)
def test_bad_compile_options_exit_2(cli_main, flags, words):
    res = cli_main(
        "scan",
        MINI / "model.safetensors",
        "--arch",
        f"{MINI / 'model.py'}:build",
        "--inputs",
        MINI / "inputs.safetensors",
        "--compile",
        *flags,
        json_report=False,
    )
    assert res.code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in res.stderr, res.stderr


@pytest.mark.slow
def test_fp8_bytes_differ_eager_vs_compiled_and_not_with_emulate():
    """docs/incidents.md #3 measured here: on the miniature's 64×256 bf16 input, norm → rowwise
    e4m3 gives different fp8 bytes eager and compiled, and identical ones with
    emulate_precision_casts (also the check that the shipped input still shows the incident)."""
    import importlib.util
    import sys

    import torch
    from safetensors.torch import load_file

    from nan_hunter.modes.compiled import fresh_compiles

    spec = importlib.util.spec_from_file_location("compile_rmsnorm_fp8_bytes", MINI / "model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dynamo imports the globals' module by name
    spec.loader.exec_module(mod)
    m = mod.build()
    m.load_state_dict(load_file(str(MINI / "model.safetensors")))
    norm = m.to(torch.bfloat16).eval().layers[0].norm
    x = load_file(str(MINI / "inputs.safetensors"))["x"]

    def fp8_bytes(t):
        return mod.quantize_rowwise(norm(t))[0].view(torch.uint8)

    with torch.no_grad():
        eager = fp8_bytes(x)
        differ = {}
        for emulate in (False, True):
            with fresh_compiles(emulate_precision_casts=emulate):
                differ[emulate] = int((torch.compile(fp8_bytes)(x) != eager).sum())
    assert eager.numel() == 16384
    assert differ[False] > 100 and differ[True] == 0, differ
