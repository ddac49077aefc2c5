"""nan_hunter/pipeline/ci_check.py: ``CheckOptions``."""

from __future__ import annotations

import dataclasses

import pytest

from nan_hunter.errors import BadInput
from nan_hunter.pipeline.ci_check import CheckOptions


def test_check_options_are_frozen_and_checked_once():
    o = CheckOptions(prompts="one prompt")
    assert (
        o.prompts == ("one prompt",) and o.has_inputs
    )  # a string is one prompt (the loading group, as scan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.device = "cuda"  # type: ignore[misc]
    with pytest.raises(BadInput, match=r"--stats 'exact': use fast or full"):
        CheckOptions(stats="exact")


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"batch": True}, "--batch decodes the inputs together: it needs --generate N"),
        ({"generate": 0}, "--generate 0: give the number of new tokens to decode"),
        ({"data": ["a.jsonl", "b.jsonl"]}, "data: expected one file name"),
    ],
)
def test_check_refuses_as_scan_does(kw, says):
    """The decoding and loading groups are scan's: the same refusal, word for word."""
    from nan_hunter.pipeline.options import ScanOptions

    for make in (lambda: CheckOptions(**kw), lambda: ScanOptions("m.safetensors", **kw)):
        with pytest.raises(BadInput) as e:
            make()
        assert str(e.value).startswith(says)


def test_a_mixed_check_names_the_checkpoint_that_cannot_take_a_prompt():
    """issue 48, item 5: model directories and a bare .safetensors file with --prompt: exit 2 naming the
    file, before anything runs (it was "inputs were given but no model can be built", no name)."""
    from pathlib import Path

    import pytest

    from nan_hunter.errors import BadInput
    from nan_hunter.pipeline.ci_check import check

    root = Path(__file__).resolve().parents[3]
    bare = str(root / "examples" / "corrupt.safetensors")
    with pytest.raises(BadInput) as e:
        check([str(root / "examples" / "tiny-llama-fp16"), bare], prompts=["hi"])
    assert str(e.value).startswith(f"{bare}: cannot take --prompt: no model can be built")
