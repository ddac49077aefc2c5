"""``serving.alone``: one request of a packed batch run by itself, from its tokens."""

from __future__ import annotations

import pytest
import torch

from nan_hunter.serving.alone import AloneRerun, alone_inputs, fails_alone, run_alone


@pytest.fixture(scope="module")
def model():
    from models.serving_llama import serving_llama

    return serving_llama("sdpa")


def test_the_hot_token_fails_alone_and_a_clean_prompt_does_not(model):
    from models.serving_llama import HOT

    assert fails_alone(model, [1, 3, 4, 5, HOT])
    assert not fails_alone(model, [1, 14, 15, 16, 13])
    logits = run_alone(model, [1, 3, 4])
    assert logits.shape == (1, 3, 32) and int(logits[0, -1].argmax()) == 5  # 4 → 5


def test_alone_rerun_replaces_only_its_step(model):
    class Base:
        run = None

        def __init__(self, m):
            self.model = m

        def inputs(self, step):
            return "kept"

        def forward(self, step):
            return "kept"

        def context(self, step):
            from nan_hunter.locate.rerun import NO_CONTEXT

            return NO_CONTEXT

        def precision(self, step, phase):
            return "base precision"

    r = AloneRerun(Base(model), 3, [1, 3, 4])
    assert r.inputs(2) == "kept" and r.forward(2) == "kept"
    assert r.precision(3, "forward") == "base precision"  # everything else is the watch's
    snap = r.inputs(3)
    assert snap.kwargs["input_ids"].tolist() == [[1, 3, 4]] and snap.kwargs["use_cache"] is False
    out = r.forward(3)()
    assert torch.equal(out.logits, run_alone(model, [1, 3, 4]))
    assert r.train(3) is None
    assert alone_inputs([7], torch.device("cpu"))["position_ids"].tolist() == [[0]]
