"""Training faults through the public API: backward, optimizer, autocast and GradScaler, on tiny
models and on real transformers models (Llama from a config, the real all-MiniLM-L6-v2)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from models.training_nets import Gate, Net
from torch import nn

import nan_hunter


def _train_sqrt_fault(level, **watch_kw):
    """Step 2's forward is finite, its backward divides by zero in layers.1.gate (SqrtBackward0)."""
    torch.manual_seed(0)
    m = Net(8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    with nan_hunter.watch(m, level=level, backward=True, optimizer=opt, **watch_kw) as w:
        for step in range(4):
            loss = m(torch.randn(3, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if step == 1:
                with torch.no_grad():
                    m.layers[1].lin.weight.zero_()
                    m.layers[1].lin.bias.zero_()
        rep = w.report()
    return m, losses, rep


@pytest.mark.parametrize("level", ["blocks", "modules"])
def test_sqrt_at_zero_in_backward(level):
    _, losses, rep = _train_sqrt_fault(level)
    assert all(v == v for v in losses[:3])  # the forward of step 2 was finite
    f = rep.first_nonfinite
    assert (f.phase, f.step, f.module, f.role) == ("backward", 2, "layers.1.gate", "producer")
    assert f.op == "aten.div.Tensor" and f.grad_fn == "SqrtBackward0" and f.kind == "nan"
    assert "torch.sqrt" in f.source and "training_nets.py" in f.source  # the forward line that made the node
    d = rep.diagnosis
    assert d.cause == "division_by_zero" and "SqrtBackward0" in d.summary
    assert "eps inside" in d.fix and "clipping does not help" in d.fix
    assert rep["first_nonfinite"]["phase"] == "backward"  # keys, as in the JSON report
    assert rep.run["backward"] is True and 2 in rep.run["failed_inputs"]
    json.dumps(rep.to_dict())


def test_fp16_gradient_overflow():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)).half()
    with torch.no_grad():
        m[1].weight.fill_(30.0)
    x = (torch.rand(4, 64) * 1e-3).half()
    with nan_hunter.watch(m, level="modules", backward=True) as w:
        out = m(x)
        assert torch.isfinite(out).all()
        (out.float() * 1000).sum().backward()
        rep = w.report()
    f = rep.first_nonfinite
    assert (f.phase, f.module, f.role) == ("backward", "1", "producer")
    assert f.op in ("aten.mm.default", "aten.addmm.default") and f.kind in ("posinf", "neginf")
    assert f.grad_fn in ("MmBackward0", "AddmmBackward0")
    assert rep.diagnosis.cause == "overflow"
    assert "GradScaler" in rep.diagnosis.fix and "bf16" in rep.diagnosis.fix


def _adam_fp16(capsule_dir=None):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).half()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)  # eps 1e-8 is 0 in fp16
    with nan_hunter.watch(m, level="modules", backward=True, optimizer=opt, capsule_dir=capsule_dir) as w:
        for _ in range(3):
            x = torch.randn(4, 8).half()
            x[:, 3] = 0  # weight[:, 3] of the first Linear gets a zero gradient: Adam divides 0 by 0
            loss = m(x).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return w.report()


def test_adam_eps_underflow_in_fp16():
    rep = _adam_fp16()
    f = rep.first_nonfinite
    assert (f.phase, f.step, f.param, f.module, f.kind) == ("optimizer", 0, "0.weight", "0", "nan")
    d = rep.diagnosis
    assert d.cause == "division_by_zero"
    assert "eps 1e-08 rounds to 0 in fp16" in "\n".join(d.evidence)
    assert "exp_avg_sq" in "\n".join(d.evidence)
    assert "fp32 master weights" in d.fix


def test_adam_op_named_from_the_capsule_copy(tmp_path):
    rep = _adam_fp16(capsule_dir=str(tmp_path / "caps"))
    assert rep.first_nonfinite.op == "aten.addcdiv_.default"
    step = tmp_path / "caps" / "step-0"
    assert sorted(p.name for p in step.iterdir()) == [
        "capsule.json",
        "grad_outputs.safetensors",
        "inputs.safetensors",
        "model.safetensors",
        "optimizer.safetensors",
    ]
    meta = json.loads((step / "capsule.json").read_text())
    assert meta["phase"] == "optimizer" and meta["optimizer"]["class"] == "Adam"


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 16)
        self.down = nn.Linear(16, 1)

    def forward(self, x):
        return self.down(self.up(x))


def test_autocast_overflow_found_and_replayed_under_autocast():
    torch.manual_seed(0)
    m = Wide()
    with torch.no_grad():
        m.up.weight.fill_(100.0)
    x = torch.full((2, 16), 50.0)  # 16 · 100 · 50 = 80000 > fp16 max, fine in fp32
    with nan_hunter.watch(m, level="modules", backward=True) as w:
        with torch.autocast("cpu", dtype=torch.float16):
            out = m(x)
        rep = w.report()
    assert not torch.isfinite(out).all()
    f = rep.first_nonfinite
    assert (f.phase, f.module, f.role, f.kind) == ("forward", "up", "producer", "posinf")
    assert f.op in ("aten.addmm.default", "aten.mm.default", "aten.linear.default")
    assert rep.diagnosis.cause == "overflow"
    assert rep.run["autocast"] == {"device_type": "cpu", "dtype": "fp16"}


def _scaled_training(sqrt_fault_at=None, steps=10):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16), Gate(), nn.Linear(16, 1))
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    with nan_hunter.watch(m, level="modules", backward=True, optimizer=opt, scaler=scaler) as w:
        for step in range(steps):
            if step == sqrt_fault_at:
                with torch.no_grad():
                    m[2].weight.zero_()
                    m[2].bias.zero_()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = m(torch.randn(8, 16)).float().pow(2).mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return w.report(), scaler


def test_gradscaler_skipped_steps_are_notes_not_faults():
    rep, scaler = _scaled_training()
    assert rep.first_nonfinite is None and rep.diagnosis is None
    skipped = rep.run["scaler_skipped_steps"]
    assert skipped and skipped[0] == 0  # 2**24 overflows fp16 gradients at once; the scaler backs off
    assert scaler.get_scale() < 2.0**24
    assert rep.run["failed_inputs"] == []
    assert any("GradScaler skipped" in n for n in rep.notes)


def test_gradscaler_real_fault_is_a_fault():
    rep, _ = _scaled_training(sqrt_fault_at=8)
    f = rep.first_nonfinite
    assert f is not None and f.phase == "backward" and f.step == 8
    assert f.grad_fn == "SqrtBackward0" and rep.diagnosis.cause == "division_by_zero"
    assert 8 not in rep.run["scaler_skipped_steps"]


def _tiny_llama(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(dtype)


def _train_llama(m, watch: bool, steps=3, scale=1.0):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    ctx = nan_hunter.watch(m, level="modules", backward=True, optimizer=opt) if watch else None
    with ctx if ctx is not None else torch.enable_grad():
        for _ in range(steps):
            ids = torch.randint(0, 128, (2, 12), generator=g)
            loss = m(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            (loss * scale).backward()
            opt.step()
            losses.append(loss.detach().clone())
        rep = ctx.report() if ctx is not None else None
    return losses, rep


def test_training_numerics_bitwise_unchanged_and_hooks_removed():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = _tiny_llama()
        watched = _tiny_llama()
        l0, _ = _train_llama(plain, watch=False)
        l1, rep = _train_llama(watched, watch=True)
    assert rep.first_nonfinite is None
    assert all(torch.equal(a, b) for a, b in zip(l0, l1))
    for (n, a), (_, b) in zip(plain.state_dict().items(), watched.state_dict().items()):
        assert torch.equal(a, b), n
    for mod in watched.modules():
        assert not mod._forward_hooks and not mod._forward_pre_hooks
    for p in watched.parameters():
        assert not p._backward_hooks


def test_hooks_removed_when_the_model_raises():
    m = Net(8)

    class Boom(Exception):
        pass

    def bad(*_):
        raise Boom

    h = m.layers[1].register_forward_hook(bad)
    with pytest.raises(Boom):
        with nan_hunter.watch(m, backward=True, optimizer=torch.optim.SGD(m.parameters(), lr=0.1)):
            m(torch.randn(2, 8)).sum().backward()
    h.remove()
    assert all(not p._backward_hooks for p in m.parameters())
    assert all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in m.modules())


def _first_bad_module_backward(m, run):
    """An independent oracle (module full-backward hooks and parameter hooks, not nanhunter's
    tensor hooks): the leaf module whose gradient w.r.t. an input or one of its parameters went
    non-finite first, in autograd's order, while the gradient reaching its outputs was finite."""
    clock = iter(range(10**9))
    first_bad: dict = {}
    out_finite: dict = {}

    def mod_hook(mod, gin, gout):
        out_finite[mod] = all(g is None or bool(torch.isfinite(g).all()) for g in gout)
        if any(g is not None and not bool(torch.isfinite(g).all()) for g in gin):
            first_bad.setdefault(mod, next(clock))

    def param_hook(mod):
        def hook(g):
            if not bool(torch.isfinite(g).all()):
                first_bad.setdefault(mod, next(clock))

        return hook

    names = {mod: n for n, mod in m.named_modules()}
    leaves = [mod for mod in m.modules() if not list(mod.children())]
    hs = [mod.register_full_backward_hook(mod_hook) for mod in leaves]
    hs += [p.register_hook(param_hook(mod)) for mod in leaves for p in mod.parameters(recurse=False)]
    try:
        run()
    finally:
        for h in hs:
            h.remove()
    cands = sorted((t, names[mod]) for mod, t in first_bad.items() if out_finite.get(mod, True))
    return cands[0][1] if cands else None


def test_real_llama_fp16_backward_overflow_matches_an_oracle():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = _tiny_llama(torch.float16)
        ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))

        def step():
            m.zero_grad()
            (
                m(input_ids=ids, labels=ids).loss * 1e6
            ).backward()  # logits grads fine, RMSNorm backward overflows

        oracle = _first_bad_module_backward(m, step)
        assert oracle is not None
        with nan_hunter.watch(m, level="modules", backward=True) as w:
            step()
            rep = w.report()
    f = rep.first_nonfinite
    assert f.phase == "backward" and f.role == "producer" and f.module == oracle
    assert f.op and f.op.startswith("aten.") and f.grad_fn and f.grad_fn.endswith("Backward0")
    assert rep.diagnosis.cause == "overflow"


def test_real_minilm_adam_fp16_names_the_embedding(minilm_dir):
    from transformers import AutoModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = AutoModel.from_pretrained(str(minilm_dir)).half().train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    ids = torch.randint(1000, 2000, (2, 16), generator=torch.Generator().manual_seed(0))
    with nan_hunter.watch(m, level="blocks", backward=True, optimizer=opt) as w:
        loss = m(input_ids=ids).last_hidden_state.float().pow(2).mean()
        loss.backward()
        opt.step()
        rep = w.report()
    f = rep.first_nonfinite
    # rows of unused tokens get an exactly zero gradient: Adam computes 0 / (sqrt(0) + 0)
    assert (f.phase, f.param, f.module) == (
        "optimizer",
        "embeddings.word_embeddings.weight",
        "embeddings.word_embeddings",
    )
    assert rep.diagnosis.cause == "division_by_zero"


def test_a_watch_left_on_for_a_training_run_keeps_flat_memory():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16), nn.Linear(16, 1))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    seen = {}
    with nan_hunter.watch(m, level="modules", backward=True, optimizer=opt, scaler=scaler) as w:
        for step in range(121):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = m(torch.randn(8, 16)).float().pow(2).mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if step in (30, 120):
                seen[step] = (
                    w.sink.rows_in_use,
                    len(w._detail),
                    len(w.grads.calls),
                    len(w.grads.root_grads),
                    len(w.contexts),
                    len(w._inputs),
                )
        rep = w.report()
    assert seen[30] == seen[120]
    assert seen[120][1] <= w.window + 1 and seen[120][3] <= 1
    assert rep.first_nonfinite is None and rep.run["optimizer_steps"] == 121
