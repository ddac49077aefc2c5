"""nan_hunter/model/options.py: the loading, decoding and backward groups, one refusal each, the same
in every command that is made of them."""

from __future__ import annotations

import pytest

from nan_hunter.bisection.options import BisectOptions
from nan_hunter.errors import BadInput
from nan_hunter.model.options import BackwardOptions, DecodeOptions, LoadOptions, check_generate
from nan_hunter.pipeline.options import CheckOptions, ScanOptions


def test_loading_normalises_repeatable_options():
    o = LoadOptions(prompts="one prompt", inputs=["a.safetensors"])
    o.check_loading()
    assert (o.prompts, o.inputs, o.has_inputs) == (("one prompt",), ("a.safetensors",), True)
    assert not LoadOptions().has_inputs


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "3"])
def test_generate_needs_a_whole_number(n):
    with pytest.raises(BadInput, match=r"give the number of new tokens to decode, e.g. --generate 16"):
        check_generate(n)


def test_batch_needs_generate_and_loss_needs_backward():
    with pytest.raises(BadInput, match="--batch decodes the inputs together: it needs --generate N"):
        DecodeOptions(batch=True).check_decoding()
    with pytest.raises(BadInput, match="--loss is the loss --backward differentiates: add --backward"):
        BackwardOptions(loss="l.py:fn").check_loss()


@pytest.mark.parametrize(
    "make",
    [
        lambda **k: ScanOptions("m.safetensors", **k),
        lambda **k: BisectOptions("m.safetensors", **k),
        lambda **k: CheckOptions(**k),
    ],
)
def test_every_command_refuses_alike(make):
    """The shared groups' refusals are word for word the same in scan, bisect and check."""
    with pytest.raises(BadInput, match=r"^data: expected one file name"):
        make(data=["a", "b"])
    with pytest.raises(BadInput, match=r"^--generate 0: give the number"):
        make(generate=0)
