"""nan_hunter/pipeline/ci_check.py: ``CheckOptions``."""

from __future__ import annotations

import dataclasses

import pytest

from nan_hunter.errors import BadInput
from nan_hunter.pipeline.ci_check import CheckOptions


def test_check_options_are_frozen_and_checked_once():
    o = CheckOptions(prompts="one prompt")
    assert o.prompts == ["one prompt"]  # a string is one prompt
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.device = "cuda"  # type: ignore[misc]
    with pytest.raises(BadInput, match=r"--stats 'exact': use fast or full"):
        CheckOptions(stats="exact")
