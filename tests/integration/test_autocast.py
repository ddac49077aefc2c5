"""A watch under ``torch.autocast`` (issue 31): the same answer whatever ``on_fault`` is (a report
raised from inside the user's autocast block re-runs outside its weight cache), a −inf cast named
like a +inf one, the run's dtype as the ops computed it, and the parameter that does not fit it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nan_hunter
from nan_hunter import NonFiniteError

FAULT = 3  # the step before which a weight is scaled past fp16's max


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.down = nn.Linear(32, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.down(self.act(self.up(x))))


def _train_mlp(on_fault: str, cache_enabled: bool = True, steps: int = 5):
    """Autocast fp16 on CPU; ``up.weight`` scaled ×1e6 (absmax ≈ 2.5e5 > 65504) before step FAULT."""
    torch.manual_seed(0)
    m = MLP()
    opt = torch.optim.SGD(m.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    try:
        with nan_hunter.watch(m, backward=True, optimizer=opt, on_fault=on_fault) as w:
            for step in range(steps):
                if step == FAULT:
                    with torch.no_grad():
                        m.up.weight.mul_(1e6)
                with torch.autocast("cpu", dtype=torch.float16, cache_enabled=cache_enabled):
                    loss = m(torch.randn(4, 16, generator=g)).float().pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if w.should_stop:
                    break
            return w.report()
    except NonFiniteError as e:
        assert on_fault == "raise"
        return e.report


@pytest.mark.parametrize(
    ("on_fault", "cache_enabled"), [("record", True), ("stop", True), ("raise", True), ("raise", False)]
)
def test_every_on_fault_names_the_cast_and_its_fix(on_fault, cache_enabled):
    rep = _train_mlp(on_fault, cache_enabled)
    f, d = rep.first_nonfinite, rep.diagnosis
    assert (f.step, f.module, f.op, f.kind) == (FAULT, "up", "aten._to_copy.default", "posinf")
    assert d.cause == "overflow"
    # the replay ran outside the user's autocast: fp32 is fp32 there
    assert rep.replay["fp32"]["finite"] and rep.replay["bf16"]["finite"] and not rep.replay["fp16"]["finite"]
    assert d.fix_verified is not None and d.fix_verified.finite


def test_raise_leaves_the_users_autocast_as_it_was():
    """The report raised from inside the user's autocast block re-runs outside it; the block's
    state (enabled, dtype, cache) is the user's again when the error arrives."""
    torch.manual_seed(0)
    m = MLP()
    with torch.no_grad():
        m.up.weight.mul_(1e6)
    with nan_hunter.watch(m, on_fault="raise"):
        with torch.autocast("cpu", dtype=torch.float16):
            with pytest.raises(NonFiniteError) as ei:
                m(torch.randn(4, 16))
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16
            assert torch.is_autocast_cache_enabled()
    assert ei.value.report.first_nonfinite.op == "aten._to_copy.default"
    assert not torch.is_autocast_enabled("cpu")


def test_the_weight_that_does_not_fit_fp16_is_named_with_a_fix_that_applies():
    """Contract v1.3: an overflow caused by a parameter that does not fit the run's dtype names it."""
    rep = _train_mlp("record")
    f, d = rep.first_nonfinite, rep.diagnosis
    assert f.param == d.param == "up.weight"
    assert (
        d.summary.startswith("the cast of parameter up.weight (absmax ")
        and " to fp16 overflowed" in d.summary
    )
    assert "matmul" not in d.summary
    assert any(e.startswith("parameter up.weight (float32[32, 16]): absmax ") for e in d.evidence)
    # the fix proposed first is the one verified on a copy
    assert (
        d.fix_verified.finite and d.fix_verified.change == "run in bf16" and d.fix.startswith("Run in bf16")
    )
    # the first-non-finite panel names it on its own row
    assert any(
        line.strip("│ ").split() == ["parameter", "up.weight"] for line in rep.render(width=100).splitlines()
    )


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("on_fault", ["record", "raise"])
def test_a_negative_weight_cast_to_neginf_is_named_not_the_matmul_after_it(on_fault):
    """One weight at −1e6: its fp16 cast makes −inf alone (not a mask: no sentinel made it), and
    the matmul then makes +inf; the cast is the first fault."""
    m = _llama()
    opt = torch.optim.SGD(m.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    try:
        with nan_hunter.watch(m, backward=True, optimizer=opt, on_fault=on_fault) as w:
            for step in range(FAULT + 1):
                if step == FAULT:
                    with torch.no_grad():
                        m.model.layers[1].mlp.up_proj.weight[3, 5] = -1e6
                ids = torch.randint(0, 64, (2, 8), generator=g)
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = m(input_ids=ids, labels=ids).loss
                opt.zero_grad()
                loss.backward()
                opt.step()
            rep = w.report()
    except NonFiniteError as e:
        rep = e.report
    f, d = rep.first_nonfinite, rep.diagnosis
    assert (f.step, f.module, f.op, f.kind) == (
        FAULT,
        "model.layers.1.mlp.up_proj",
        "aten._to_copy.default",
        "neginf",
    )
    assert d.cause == "overflow" and f.param == "model.layers.1.mlp.up_proj.weight"


def _watched_overflow(autocast: bool):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    with torch.no_grad():
        m[0].weight.mul_(1e6)  # absmax ≈ 2.5e5: fits fp32, not fp16
    with nan_hunter.watch(m, level="modules") as w:
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            m(torch.randn(4, 16))
        return w.report()


def test_a_watch_under_autocast_is_an_fp16_run(tmp_path):
    rep = _watched_overflow(autocast=True)
    assert rep.run["autocast"] == {"device_type": "cpu", "dtype": "fp16"}
    assert rep.run["dtype"] == rep.diagnosis.dtype == "fp16"
    text = rep.render(width=100)
    assert "fp16 (torch.autocast cpu) on cpu" in text
    assert "fp16 max 65504" in text and "fp32 max" not in text  # the headroom strip
    rep.to_html(str(tmp_path / "r.html"))
    assert "fp16 (torch.autocast cpu)" in (tmp_path / "r.html").read_text()
    rep.to_json(str(tmp_path / "r.json"))
    import json

    assert json.loads((tmp_path / "r.json").read_text())["run"]["autocast"] == {
        "device_type": "cpu",
        "dtype": "fp16",
    }


def test_a_watch_without_autocast_has_no_autocast():
    rep = _watched_overflow(autocast=False)
    assert rep.run["autocast"] is None and rep.run["dtype"] == "fp32"
