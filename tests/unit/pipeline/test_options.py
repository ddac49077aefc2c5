"""``ScanOptions``: every option validated in one place; the matrix of mode combinations (docs/contract.md,
"Modes compose"): what composes is accepted, what stays refused names its reason in torch or the library."""

from __future__ import annotations

import itertools
import math

import pytest

from nan_hunter.errors import BadInput
from nan_hunter.pipeline.options import ScanOptions

TORCHRUN = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}


#: (backward, generate, compile, device_map, torchrun) -> None (composes) or a word of the refusal's reason
def expected(backward: bool, generate: bool, compile_: bool, device_map: bool, torchrun: bool) -> str | None:
    if backward and generate:
        return "torch.no_grad"
    if compile_ and device_map:
        return "AlignDevicesHook"
    if device_map and torchrun:
        return "dispatch_model"
    return None


@pytest.fixture
def one_process(monkeypatch):
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)


@pytest.mark.parametrize(
    "backward, generate, compile_, device_map, torchrun", list(itertools.product([False, True], repeat=5))
)
def test_mode_combinations(monkeypatch, one_process, backward, generate, compile_, device_map, torchrun):
    if torchrun:
        for k, v in TORCHRUN.items():
            monkeypatch.setenv(k, v)
    kw = {
        "backward": backward,
        "generate": 4 if generate else None,
        "compile": "inductor" if compile_ else None,
        "device_map": "auto" if device_map else None,
    }
    why = expected(backward, generate, compile_, device_map, torchrun)
    if why is None:
        opts = ScanOptions("model_dir", **kw)
        assert opts.backward is backward and (opts.generate == 4) is generate
        assert (opts.placement is not None) is device_map
    else:
        with pytest.raises(BadInput, match=why) as e:
            ScanOptions("model_dir", **kw)
        assert "not supported yet" not in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"compile": "tvm"}, "--compile-backend"),
        ({"compile": "inductor", "rtol": 0.0}, "--rtol"),
        ({"compile": "inductor", "rtol": math.nan}, "--rtol"),
        ({"compile": "inductor", "dtype": "fp8-e5m2"}, "TorchDispatchMode"),
        ({"dtype": "fp7"}, "--dtype"),
        ({"stats": "slow"}, "--stats"),
        ({"loss": "l.py:fn"}, "add --backward"),
        ({"generate": 0}, "--generate"),
        ({"generate": True}, "--generate"),
        ({"batch": True}, "needs --generate"),
        ({"max_memory": ("cpu=1GB",)}, "--device-map"),
        ({"device_map": "balanced"}, "only auto"),
    ],
)
def test_each_refusal_is_one_line(one_process, kw, word):
    with pytest.raises(BadInput, match=word) as e:
        ScanOptions("model.safetensors", **kw)
    assert "\n" not in str(e.value)


def test_values_are_canonical_and_frozen(one_process):
    o = ScanOptions("m.safetensors", dtype="half", prompts=["a", "b"], inputs=["x.safetensors"])
    assert o.dtype == "fp16" and o.prompts == ("a", "b") and o.inputs == ("x.safetensors",)
    with pytest.raises(AttributeError):
        o.dtype = "bf16"  # type: ignore[misc]


def test_a_capsule_refuses_what_it_brings_itself(one_process, tmp_path):
    step = tmp_path / "step-3"
    step.mkdir()
    (step / "capsule.json").write_text("{}")
    assert ScanOptions(str(step)).capsule
    for kw, flag in (
        ({"dtype": "fp16"}, "--dtype"),
        ({"prompts": ["x"]}, "--prompt"),
        ({"backward": True}, "--backward"),
        ({"generate": 2}, "--generate"),
        ({"device_map": "auto"}, "--device-map"),
    ):
        with pytest.raises(BadInput, match=f"{flag} does not apply to a capsule"):
            ScanOptions(str(step), **kw)


def test_a_string_is_one_prompt_one_input_one_memory_cap(one_process):
    """issue 31 (7): ``prompts="hello"`` ran five one-character prompts."""
    o = ScanOptions("m.safetensors", prompts="hello", inputs="x.safetensors")
    assert o.prompts == ("hello",) and o.inputs == ("x.safetensors",)
    with pytest.raises(BadInput, match="max_memory"):
        ScanOptions("m.safetensors", max_memory=b"cpu=1GB")
    with pytest.raises(BadInput, match="data: expected one file name"):
        ScanOptions("m.safetensors", data=["a.jsonl"])
