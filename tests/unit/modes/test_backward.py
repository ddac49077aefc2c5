"""nan_hunter/modes/backward.py: labels for a causal LM's own loss, loading ``--loss``, and
``Loss.run`` with its one-line errors, on tiny real models and real loss files."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from nan_hunter.config import default_config
from nan_hunter.dtypes import RunDtype
from nan_hunter.errors import BadInput
from nan_hunter.model.prepare import Prepared
from nan_hunter.modes.backward import BackwardMode, causal_lm_labels, is_causal_lm, load_loss
from nan_hunter.report import Report, RunInfo

LOSSES = """
import sys
import torch


def mse(outputs, batch):
    return ((outputs - batch["y"]) ** 2).mean()


def vector(outputs, batch):
    return outputs.sum(-1)


def integer(outputs, batch):
    return torch.tensor(3)


def detached(outputs, batch):
    return outputs.detach().sum()


def text(outputs, batch):
    return "low"


def boom(outputs, batch):
    raise KeyError("y")


def leave(outputs, batch):
    sys.exit(3)


NOT_CALLABLE = 1
"""


class Lin(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x, y=None):
        return self.lin(x)


@pytest.fixture
def losses(tmp_path):
    f = tmp_path / "losses.py"
    f.write_text(LOSSES)
    return f


# --- causal_lm_labels ---------------------------------------------------------------------------


def test_labels_are_the_ids_with_padding_set_to_minus_100():
    ids = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    out = causal_lm_labels({"input_ids": ids, "attention_mask": mask})
    assert out["labels"].tolist() == [[-100, -100, 5, 6], [1, 2, 3, 4]]
    assert ids.tolist() == [[0, 0, 5, 6], [1, 2, 3, 4]]  # a copy: the batch is untouched


def test_labels_without_mask_or_with_a_mask_of_another_shape_are_the_ids():
    ids = torch.tensor([[7, 8]])
    assert causal_lm_labels({"input_ids": ids})["labels"].tolist() == [[7, 8]]
    assert causal_lm_labels({"input_ids": ids, "attention_mask": torch.zeros(1, 3)})["labels"].tolist() == [
        [7, 8]
    ]


def test_labels_brought_by_the_inputs_are_kept_and_no_ids_is_bad_input():
    assert causal_lm_labels({"input_ids": torch.ones(1, 2), "labels": torch.ones(1, 2)}) == {}
    with pytest.raises(BadInput, match="needs input_ids"):
        causal_lm_labels({"x": torch.ones(1, 2)})


# --- load_loss ----------------------------------------------------------------------------------


def test_load_loss_errors_name_loss_not_arch(losses, tmp_path):
    m = Lin()
    cases = [
        ("nocolon", "expected path/to/file.py:factory"),
        (f"{tmp_path / 'missing.py'}:fn", "not found"),
        (f"{losses}:nope", "has no callable 'nope'"),
        (f"{losses}:NOT_CALLABLE", "has no callable 'NOT_CALLABLE'"),
        (f"{losses}:1x", "is not a function name"),
    ]
    for spec, words in cases:
        with pytest.raises(BadInput) as e:
            load_loss(m, spec)
        msg = str(e.value)
        assert msg.startswith("--loss ") and words in msg and "--arch" not in msg, msg


def test_without_a_loss_a_model_that_is_not_a_causal_lm_is_refused():
    with pytest.raises(BadInput, match="Lin is not a Hugging Face causal LM"):
        load_loss(Lin(), None)
    assert not is_causal_lm(Lin())


# --- Loss.run -----------------------------------------------------------------------------------


def test_loss_run_gives_outputs_and_a_scalar_that_backpropagates(losses):
    torch.manual_seed(0)
    m = Lin()
    loss = load_loss(m, f"{losses}:mse")
    assert loss.describe == f"{losses}:mse" and loss.extra({"x": 1}) == {}
    kw = {"x": torch.ones(3, 2), "y": torch.zeros(3, 1)}
    out, val = loss.run(m, kw)
    with torch.no_grad():
        want = (m(kw["x"]) ** 2).mean()
    assert out.shape == (3, 1) and val.shape == () and torch.allclose(val.detach(), want)
    val.backward()
    assert m.lin.weight.grad is not None and torch.isfinite(m.lin.weight.grad).all()
    assert torch.allclose(loss.of(m, kw).detach(), want)


@pytest.mark.parametrize(
    "fn, words",
    [
        ("vector", "returned Tensor of shape [3], not a floating scalar tensor"),
        ("integer", "returned Tensor of shape [], not a floating scalar tensor"),
        ("text", "returned str, not a floating scalar tensor"),
        ("detached", "does not depend on the model's parameters"),
        ("boom", "raised KeyError: 'y'"),
        ("leave", "called sys.exit(3); it must return a scalar tensor"),
    ],
)
def test_loss_run_refuses_bad_loss_functions_in_one_line(losses, fn, words):
    loss = load_loss(Lin(), f"{losses}:{fn}")
    with pytest.raises(BadInput, match=re.escape(words)) as e:
        loss.run(Lin(), {"x": torch.ones(3, 2)})
    assert str(e.value).startswith(f"--loss: {losses}:{fn} ") and "\n" not in str(e.value)


def test_a_model_error_is_one_line_bad_input(losses):
    loss = load_loss(Lin(), f"{losses}:mse")
    with pytest.raises(BadInput, match=r"the model raised RuntimeError in Lin.forward\(\): ") as e:
        loss.run(Lin(), {"x": torch.ones(3, 5), "y": torch.zeros(3, 1)})
    assert "\n" not in str(e.value)


# --- the mode -----------------------------------------------------------------------------------


def test_check_loads_the_loss_and_turns_gradients_on_and_finish_says_so(losses):
    m = Lin().requires_grad_(False)
    p = Prepared(
        None,
        m,
        None,
        "test",
        [{"x": torch.ones(1, 2)}],
        ["input 0"],
        RunDtype.of("fp32"),
        torch.device("cpu"),
        default_config(),
    )
    mode = BackwardMode(f"{losses}:mse")
    mode.check(p)
    assert mode.loss is not None and all(q.requires_grad for q in m.parameters())
    out = mode.run_input(m, {"x": torch.ones(2, 2), "y": torch.zeros(2, 1)}, None)
    assert len(out) == 1 and out[0].shape == (2, 1)
    assert all(q.grad is None for q in m.parameters())  # cleared after the input
    rep = Report(run=RunInfo(dtype="fp32", device="cpu", n_inputs=1))
    mode.finish(p, rep, mode.merge([{"a": 1}]), None)
    assert rep.run.backward is True and rep.run.loss == f"{losses}:mse"
    assert rep.notes == [f"--backward: forward then backward of {losses}:mse for each input"]


def test_a_tiny_llama_has_its_own_loss_with_labels_from_the_ids():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    m = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=16,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    assert is_causal_lm(m)
    loss = load_loss(m, None)
    assert loss.describe == "LlamaForCausalLM's own loss (labels = input_ids)"
    kw = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    out, val = loss.run(m, kw)
    assert val.requires_grad and torch.allclose(val.detach(), out.loss.detach())
    assert not is_causal_lm(m.model)  # the bare LlamaModel has no labels argument
