"""``scan --device-map auto --max-memory cpu=SIZE`` (docs/contract.md, "Distributed"): a real
tiny Llama placed by accelerate with part of it offloaded to disk, against the plain run.

Offloaded modules keep their weights on ``meta`` between calls: the scan must still find the same
fault (module, op, kind), measure the real weights (a NaN planted in an offloaded weight is found
with role "weights", which needs the weights' statistics), leave the checkpoint unchanged and
remove its offload folder. The command runs in this process (``cli_main``; ``TMPDIR`` is honoured
there too), except where accelerate must be missing from the start."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

pytest.importorskip("accelerate")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llama-fp16"
DATA = [
    "a cat sat on a mat",
    "the quick brown fox",
    "hello world",
    "we shipped 3 models",
]  # #1 and #3 overflow
CAP = "cpu=150KB"  # the 360 KB example: a few modules stay in CPU memory, the rest go to disk
FAULT = "model.layers.1.mlp.down_proj"  # on disk under CAP


def tree_hash(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        h.update(str(p.relative_to(d)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dm") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in DATA))
    return path


def placed(cli, tmp_path: Path, *args: object) -> tuple:
    """``scan ARGS --device-map auto --max-memory CAP`` with its own TMPDIR; (result, tmpdir)."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    res = cli("scan", *args, "--device-map", "auto", "--max-memory", CAP, "-q", env={"TMPDIR": tmp})
    return res, tmp


@pytest.mark.slow  # two scans of the example (~10 s each on an idle 2-core machine)
def test_offloaded_run_finds_the_same_fault(cli_main, data, tmp_path):
    before = tree_hash(EXAMPLE)
    plain = cli_main("scan", EXAMPLE, "--data", data, "--dtype", "fp16", "-q")
    res, tmp = placed(cli_main, tmp_path, EXAMPLE, "--data", data, "--dtype", "fp16", "--device", "cuda")
    assert plain.code == res.code == 1, (plain.stderr, res.stderr)  # --device is overridden by --device-map
    assert res.stderr == ""
    a, b = plain.report, res.report
    key = ("input_index", "module", "op", "kind", "role")
    assert (
        [b["first_nonfinite"][k] for k in key]
        == [a["first_nonfinite"][k] for k in key]
        == [1, FAULT, "aten.mm.default", "posinf", "producer"]
    )
    assert b["run"]["failed_inputs"] == a["run"]["failed_inputs"] == [1, 3]
    assert b["modules"] == a["modules"]  # same statistics, call by call
    same = ("cause", "dtype", "module", "op", "summary", "evidence")
    assert [b["diagnosis"][k] for k in same] == [a["diagnosis"][k] for k in same]
    assert b["diagnosis"]["cause"] == "overflow"
    # the fix is verified on the failing module alone when the model is placed (offloaded weights
    # live on meta between calls), on the whole model otherwise: both find it makes the input finite
    fa, fb = a["diagnosis"]["fix_verified"], b["diagnosis"]["fix_verified"]
    assert fa["finite"] and fb["finite"] and fb["scope"] == "region"
    assert b["replay"] == a["replay"] and b["replay"]["fp16"]["finite"] is False
    note = next(n for n in b["notes"] if n.startswith("--device-map auto:"))
    assert "on disk" in note and "on cpu" in note
    assert tree_hash(EXAMPLE) == before  # nothing written into the checkpoint
    assert not list(tmp.glob("nanhunter-offload-*"))  # the offload folder was removed


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp16", "fp32"], ids=["some-on-disk", "all-on-disk"])
def test_nan_in_an_offloaded_weight_is_measured(cli_main, data, tmp_path, dtype):
    """The NaN sits in a weight that lives on disk: only reading it through accelerate's offload
    store (not the meta placeholder) lets the producer rule blame the weights. In fp32 the model
    is twice its stored size and CAP puts all of it on disk, which transformers 4.x cannot load
    (docs/compat.md): there the weights scan's own finding is the answer, reported weights-only
    (exit 1) with a note saying why the model was not built and how to fix it."""
    ck = tmp_path / "ck"
    shutil.copytree(EXAMPLE, ck)
    tensors = load_file(str(ck / "model.safetensors"))
    w = tensors[f"{FAULT}.weight"].clone()
    w[3, 5] = float("nan")
    tensors[f"{FAULT}.weight"] = w
    save_file(tensors, str(ck / "model.safetensors"), metadata={"format": "pt"})
    before = tree_hash(ck)
    plain = cli_main("scan", ck, "--prompt", "hello world", "--dtype", dtype, "-q")
    res, tmp = placed(cli_main, tmp_path, ck, "--prompt", "hello world", "--dtype", dtype)
    if dtype == "fp32" and _transformers_major() < 5:
        assert res.code == 1, res.stderr
        r = res.report
        assert r["diagnosis"]["cause"] == "nonfinite_weights" and r["first_nonfinite"] is None
        assert any(t["name"] == f"{FAULT}.weight" for t in r["weights"]["nonfinite"])
        note = next(n for n in r["notes"] if n.startswith("weights-only scan: the model was not built"))
        assert "cannot load a model placed entirely on disk" in note and "transformers>=5.0" in note
        assert tree_hash(ck) == before and not list(tmp.glob("nanhunter-offload-*"))
        return
    assert plain.code == res.code == 1, (plain.stderr, res.stderr)
    a, b = plain.report["first_nonfinite"], res.report["first_nonfinite"]
    assert (
        (b["module"], b["role"], b["kind"])
        == (a["module"], a["role"], a["kind"])
        == (FAULT, "weights", "nan")
    )
    # the op re-run sees the module's own ops, not accelerate loading the NaN weight from disk
    assert b["op"] == a["op"] == "aten.mm.default"
    assert res.report["diagnosis"] == plain.report["diagnosis"]
    assert res.report["diagnosis"]["cause"] == "nonfinite_weights"
    assert res.report["modules"] == plain.report["modules"]
    assert not any("not measured" in n for n in res.report["notes"])
    assert tree_hash(ck) == before
    assert not list(tmp.glob("nanhunter-offload-*"))


def test_a_clean_model_placed_entirely_on_disk_on_transformers_4_exits_2(cli_main, tmp_path):
    """Nothing in the weights to report, and transformers 4.x cannot load a model placed entirely on
    disk: exit 2, one line naming both fixes (docs/compat.md). On 5.x the same run is scanned."""
    if _transformers_major() >= 5:
        pytest.skip("transformers 5 loads a model placed entirely on disk")
    before = tree_hash(EXAMPLE)
    res, tmp = placed(cli_main, tmp_path, EXAMPLE, "--prompt", "hello world", "--dtype", "fp32")
    assert res.code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "cannot load a model placed entirely on disk" in res.stderr and "transformers>=5.0" in res.stderr
    assert tree_hash(EXAMPLE) == before and not list(tmp.glob("nanhunter-offload-*"))


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--device-map", "auto", "--max-memory", "cpu=lots"],
            "--max-memory cpu=lots: size 'lots' not understood",
        ),
        (["--device-map", "auto", "--max-memory", "tpu=1GB"], "device 'tpu' not understood"),
        (["--max-memory", "cpu=1GB"], "--max-memory needs --device-map auto"),
    ],
)
def test_bad_options_exit_2_in_one_line(run_main, args, message):
    res = run_main("scan", EXAMPLE, *args)
    assert res.code == 2
    assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr


def test_arch_model_is_refused(run_main, overflow_model):
    res = run_main(
        "scan",
        overflow_model["ck"],
        "--arch",
        overflow_model["arch"],
        "--inputs",
        overflow_model["inputs"],
        "--device-map",
        "auto",
    )
    assert res.code == 2 and res.stderr.count("\n") == 1
    assert "--device-map auto needs a Hugging Face directory" in res.stderr


def test_without_accelerate_names_the_install_command(run_cli, tmp_path):
    """accelerate made unimportable (a package of that name that raises ImportError shadows it) in a
    real process: one that never imported it."""
    fake = tmp_path / "site" / "accelerate"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('accelerate hidden by the test')\n")
    res = run_cli("scan", EXAMPLE, "--device-map", "auto", env={"PYTHONPATH": tmp_path / "site"})
    assert res.code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "pip install -e '.[accelerate]' in the nanhunter clone" in res.stderr
