"""``bisection.options.BisectOptions``: every bisect option checked once, before anything loads."""

from __future__ import annotations

import dataclasses

import pytest

from nan_hunter.bisection.options import BisectOptions
from nan_hunter.config import default_config
from nan_hunter.errors import BadInput


def test_defaults_are_canonical_and_frozen():
    o = BisectOptions("m.safetensors", dtype="float16", keep_dtype="float32", prompts="one prompt")
    assert (o.dtype, o.keep_dtype, o.prompts) == ("fp16", "fp32", ("one prompt",))  # a string is one prompt
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.dtype = "bf16"  # type: ignore[misc]


def test_config_defaults_fill_what_was_not_given():
    cfg = default_config()
    assert BisectOptions("m").resolved(cfg) == (cfg.bisect.granularity, float(cfg.bisect.rtol))
    assert BisectOptions("m", granularity="block", rtol=0.5).resolved(cfg) == ("block", 0.5)


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"keep_dtype": "fp16"}, "--keep-dtype fp16: use fp32 or bf16"),
        ({"dtype": "fp32"}, "nothing to bisect"),
        ({"dtype": "bf16", "keep_dtype": "bf16"}, "nothing to bisect"),
        ({"granularity": "layer"}, "--granularity layer: use leaf or block"),
        ({"over": "batches"}, "--over batches: use modules or inputs"),
        ({"rtol": 0}, "--rtol 0: give a positive number"),
        ({"rtol": float("nan")}, "--rtol nan"),
        ({"generate": 0}, "--generate 0"),
        ({"generate": True}, "--generate True"),
        ({"loss": "l.py:fn"}, "--loss is the loss --backward differentiates"),
        ({"backward": True, "generate": 4}, "bisect --backward with --generate"),
        ({"dtype": "fp99"}, "fp99"),
    ],
)
def test_a_bad_option_is_one_line_naming_the_flag(kw, says):
    with pytest.raises(BadInput, match=None) as e:
        BisectOptions("m.safetensors", **kw)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_bad_option_is_refused_before_the_checkpoint_is_opened(tmp_path):
    from nan_hunter.bisection.runner import bisect

    with pytest.raises(BadInput, match="--over"):
        bisect(str(tmp_path / "does-not-exist.safetensors"), over="nope")  # not "no such file"
