"""``watch(level="sentinel")``: what the sentinel must not miss, each answered as a full capture
answers it (module, op, step, phase, position, cause): a fault only at decode step k (the shipped
tiny-Llama fp16 example), one only in backward, one only in the optimizer update; a fault inside
a module masked before the outputs (latent on a sampled step, not a fault); a bit flipped in one
forward only (``not_reproducible``, replayed again: a transient); ``on_fault`` raise, skip and stop."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import nan_hunter
from nan_hunter.errors import NonFiniteError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llama-decode-fp16"


def _where(rep) -> tuple:
    f = rep.first_nonfinite
    return (
        f.module,
        f.op,
        f.step,
        f.phase,
        f.position,
        f.kind,
        rep.diagnosis.cause if rep.diagnosis else None,
    )


@pytest.mark.parametrize("sample_every", [None, 4])
def test_a_fault_only_at_decode_step_k_is_found_as_blocks_finds_it(sample_every):
    """Also when step k is a sampled step (``sample_every=4``: steps 3, 7...): its blocks are
    hooked, and its inputs are kept as a lean step's (the KV cache's length at the start, a cropped
    copy taken only because it failed), so the replay starts from the same cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nan_hunter.model.placement import dtype_keyword

    tok = AutoTokenizer.from_pretrained(str(EXAMPLE))
    model = AutoModelForCausalLM.from_pretrained(str(EXAMPLE), **{dtype_keyword(): torch.float16}).eval()
    enc = tok("the 1 2 3", return_tensors="pt")
    enc.pop("token_type_ids", None)
    reps, seqs = {}, {}
    for level in ("blocks", "sentinel"):
        kw = {"sample_every": sample_every} if level == "sentinel" else {}
        with nan_hunter.watch(model, level=level, **kw) as w, torch.no_grad():
            out = model.generate(
                **enc, max_new_tokens=8, do_sample=False, pad_token_id=2, return_dict_in_generate=True
            )
        reps[level], seqs[level] = w.report(), out.sequences
    assert torch.equal(seqs["blocks"], seqs["sentinel"])
    assert _where(reps["sentinel"]) == _where(reps["blocks"])
    f = reps["sentinel"].first_nonfinite
    assert (f.step, f.module, f.op, f.position) == (3, "model.layers.0", "aten.add.Tensor", 7)
    assert reps["sentinel"].run["level"] == "sentinel" and reps["blocks"].run["level"] == "blocks"
    if sample_every:
        assert w.recorder.sampled_steps >= 1 and 3 in w.recorder.failed_forwards()


class Block(nn.Module):
    def __init__(self, sqrt: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.sqrt = sqrt
        self.on = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.sqrt and self.on:  # finite forward; the gradient at the minimum is 1/0
            return torch.sqrt(y - y.detach().min())
        return torch.relu(y)


class Net(nn.Module):
    """A batch whose first value is 7 switches block 1 to a forward whose backward is non-finite."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block(sqrt=True)])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.layers[1].on = bool(x[0, 0] == 7.0)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _train(level: str, fault: str, on_fault: str = "record", steps: int = 5, at: int = 2):
    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    losses = []
    with nan_hunter.watch(m, level=level, backward=True, optimizer=opt, on_fault=on_fault) as w:
        for i in range(steps):
            x = torch.randn(2, 8)
            if i == at and fault == "backward":
                x[0, 0] = 7.0
            loss = m(x).sum()
            loss.backward()
            lr = opt.param_groups[0]["lr"]
            if i == at and fault == "optimizer":
                opt.param_groups[0]["lr"] = float("inf")
            opt.step()
            opt.param_groups[0]["lr"] = lr
            opt.zero_grad()
            losses.append(float(loss.detach()))
            if w.should_stop:
                break
    return w, m, losses


@pytest.mark.parametrize("fault,phase", [("backward", "backward"), ("optimizer", "optimizer")])
def test_a_fault_only_in_backward_or_the_update_is_found_as_blocks_finds_it(fault, phase):
    reps = {level: _train(level, fault)[0].report() for level in ("blocks", "sentinel")}
    assert _where(reps["sentinel"]) == _where(reps["blocks"])
    f = reps["sentinel"].first_nonfinite
    assert (f.step, f.phase) == (2, phase)
    assert f.module == ("layers.1" if fault == "backward" else "layers.0.lin")


def test_skip_leaves_the_last_good_state_and_trains_on():
    w, m, losses = _train("sentinel", "optimizer", on_fault="skip")
    assert w.report().run["skipped_steps"] == [2]
    assert all(torch.isfinite(p).all() for p in m.parameters())
    assert len(losses) == 5 and all(x == x for x in losses)


def test_stop_leaves_the_last_good_state_and_stops():
    w, m, losses = _train("sentinel", "optimizer", on_fault="stop")
    assert w.should_stop and len(losses) == 3
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_raise_comes_after_the_replay_located_it():
    with pytest.raises(NonFiniteError) as e:
        _train("sentinel", "backward", on_fault="raise")
    f = e.value.report.first_nonfinite
    assert (f.step, f.phase, f.module) == (2, "backward", "layers.1")


class Masked(nn.Module):
    """Block 1 makes NaN where its input is negative; the root puts zeros there before the head:
    masked before the outputs, so the outputs stay finite."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers[0](x)
        h = self.layers[1](h)
        h = torch.where(torch.isnan(h), torch.zeros_like(h), h)
        return self.head(h)


def test_a_masked_fault_is_latent_on_a_sampled_step_and_not_a_fault():
    torch.manual_seed(0)
    m = Masked()
    with torch.no_grad():
        m.layers[1].bias[0] = float("nan")
    with nan_hunter.watch(m, level="sentinel", sample_every=2) as w, torch.no_grad():
        for _ in range(4):
            out = m(torch.randn(2, 8))
    assert torch.isfinite(out).all()
    rep = w.report()
    assert rep.first_nonfinite is None
    assert rep.run["latent"] == [{"step": 1, "module": "layers.1"}, {"step": 3, "module": "layers.1"}]
    assert rep.run["sample_every"] == 2
    assert any(n.startswith("latent: at sampled step 1 layers.1") for n in rep.notes)


class Exp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x) * 0.01


def test_a_bit_flipped_in_one_forward_only_is_not_reproducible():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), Exp(), nn.Linear(8, 1))
    seen = {"n": 0}

    def flip(mod, args, out):
        seen["n"] += 1
        if seen["n"] == 2:  # step 1's forward, once: a failing device, not the model
            out = out.clone()
            out.view(torch.int32)[0, 0] = 0x7F800000  # exponent all ones: +inf
            return out
        return None

    m[1].register_forward_hook(flip)
    with nan_hunter.watch(m, level="sentinel") as w, torch.no_grad():
        for _ in range(3):
            m(torch.randn(4, 8))
    rep = w.report()
    f = rep.first_nonfinite
    assert (f.step, f.reproducible) == (1, False)
    assert rep.diagnosis.cause == "not_reproducible"
    assert any(
        "replayed 3 times from its kept inputs, every replay finite" in n and "transient" in n
        for n in rep.notes
    )
