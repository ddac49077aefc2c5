"""``watch(..., on_fault=...)``: raise, stop, skip (bitwise: parameters and optimizer state as before
the faulty step, against a control run that never ran it; stop with optimizer= likewise), with AdamW, SGD with momentum, the
foreach and fused variants, GradScaler and CPU autocast, and gradient accumulation; and the leaf
module and op named by a plain watch(model) in a loop whose weights change after the fault."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn

import nan_hunter
from nan_hunter import NonFiniteError

FAULT = 2  # the step whose batch overflows exp() in layers.0.act


class Exp(nn.Module):
    def forward(self, x):
        return torch.exp(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = Exp()

    def forward(self, x):
        return self.act(self.lin(x)) * 0.01


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x)


def _batches(n, fault=FAULT, micro=1, device="cpu"):
    g = torch.Generator().manual_seed(1)
    out = []
    for s in range(n):
        step = []
        for j in range(micro):
            x = torch.randn(4, 8, generator=g) * 0.1
            if s == fault and j == 0:
                x = torch.full((4, 8), 400.0)  # lin output far past 88: exp overflows to inf
            step.append(x.to(device))
        out.append(step)
    return out


OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
    "sgd_momentum_foreach": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, foreach=True),
}


def _train(
    opt_name,
    watch_kw=None,
    leave_out=None,
    micro=1,
    autocast=None,
    scaler=False,
    steps=5,
    check=None,
    device="cpu",
    stop=False,
):
    """``stop``: leave the loop once ``w.should_stop`` is set (after that step), as a loop polling it does."""
    torch.manual_seed(0)
    m = Net().to(device)
    opt = OPTIMIZERS[opt_name](m.parameters())
    sc = torch.amp.GradScaler(device, init_scale=2.0**8) if scaler else None
    data = _batches(steps, micro=micro, device=device)
    w = (
        nan_hunter.watch(m, backward=True, optimizer=opt, scaler=sc, **watch_kw)
        if watch_kw is not None
        else None
    )
    snaps = {}
    if w is not None:
        w.__enter__()
    try:
        for s, step in enumerate(data):
            if s == leave_out:
                continue
            snaps[s] = (copy.deepcopy(m.state_dict()), copy.deepcopy(opt.state_dict()))
            opt.zero_grad()
            for x in step:
                with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
                    loss = m(x).float().pow(2).mean() / micro
                (sc.scale(loss) if sc else loss).backward()
            if sc:
                sc.step(opt)
                sc.update()
            else:
                opt.step()
            if stop and w.should_stop:
                break
        rep = w.report() if w is not None else None
    finally:
        if w is not None:
            w.__exit__(None, None, None)
    return m, opt, rep, snaps


def _triton_device() -> str:
    """CPU tensors when the Triton kernels are interpreted (no GPU), CUDA ones otherwise."""
    import os

    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_skip_is_bitwise_the_run_without_that_step(opt_name):
    m, opt, rep, _ = _train(opt_name, {"on_fault": "skip", "level": "blocks"})
    m2, opt2, _, _ = _train(opt_name, None, leave_out=FAULT)
    assert rep.run["skipped_steps"] == [FAULT]
    assert all(torch.isfinite(p).all() for p in m.parameters())
    assert _same(m.state_dict(), m2.state_dict())
    assert _same(opt.state_dict()["state"], opt2.state_dict()["state"])
    f = rep.first_nonfinite
    assert (f.step, f.phase, f.module, f.op, f.kind) == (
        FAULT,
        "forward",
        "layers.0.act",
        "aten.exp.default",
        "posinf",
    )
    assert rep.diagnosis.cause == "overflow" and f.reproducible is True


def test_skip_with_gradient_accumulation():
    m, opt, rep, _ = _train("adamw", {"on_fault": "skip"}, micro=2)
    m2, opt2, _, _ = _train("adamw", None, leave_out=FAULT, micro=2)
    assert rep.run["skipped_steps"] == [2 * FAULT + 1]  # the forward after which that step's update ran
    assert _same(m.state_dict(), m2.state_dict()) and _same(
        opt.state_dict()["state"], opt2.state_dict()["state"]
    )
    assert rep.first_nonfinite.step == 2 * FAULT and rep.first_nonfinite.module == "layers.0.act"


@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16])
def test_skip_under_autocast(autocast):
    m, opt, rep, _ = _train("adamw_foreach", {"on_fault": "skip"}, autocast=autocast)
    m2, opt2, _, _ = _train("adamw_foreach", None, leave_out=FAULT, autocast=autocast)
    assert rep.run["skipped_steps"] == [FAULT]
    assert _same(m.state_dict(), m2.state_dict()) and _same(
        opt.state_dict()["state"], opt2.state_dict()["state"]
    )


@pytest.mark.parametrize("opt_name", ["adamw", "adamw_fused"])
def test_skip_with_grad_scaler(opt_name):
    snaps_after = {}
    m, opt, rep, snaps = _train(opt_name, {"on_fault": "skip"}, scaler=True, autocast=torch.float16)
    # the faulty step left parameters and optimizer state as they were; the steps after it trained on
    before, after = snaps[FAULT], snaps[FAULT + 1]
    assert _same(before[0], after[0]) and _same(before[1]["state"], after[1]["state"])
    assert not _same(after[0], m.state_dict())
    assert FAULT in rep.run["skipped_steps"] and FAULT not in rep.run["scaler_skipped_steps"]
    del snaps_after


def test_raise_carries_the_explained_report():
    with pytest.raises(NonFiniteError) as ei:
        _train("adamw", {"on_fault": "raise"})
    assert isinstance(ei.value, RuntimeError)
    rep = ei.value.report
    f = rep.first_nonfinite
    assert (f.step, f.module, f.op) == (FAULT, "layers.0.act", "aten.exp.default")
    assert rep.diagnosis.cause == "overflow" and "layers.0.act" in str(ei.value)


def test_stop_sets_should_stop_and_raises_nothing():
    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    ran = []
    with nan_hunter.watch(m, backward=True, optimizer=opt, on_fault="stop") as w:
        for s, (x,) in enumerate(_batches(5)):
            assert not w.should_stop
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
            ran.append(s)
            if w.should_stop:
                break
    assert ran == [0, 1, FAULT] and w.report().first_nonfinite.step == FAULT


@pytest.mark.parametrize("opt_name", ["adamw", "adamw_fused", "sgd_momentum_foreach"])
def test_stop_leaves_the_last_good_state_to_save(opt_name, tmp_path):
    """issue 31 (8), contract v1.3: with optimizer=, the failing step's update is not applied, so
    what the user saves after stopping is bitwise the run that never took that step, and finite."""
    from safetensors.torch import load_file, save_file

    m, opt, rep, snaps = _train(opt_name, {"on_fault": "stop"}, stop=True)
    m2, opt2, _, _ = _train(opt_name, None, steps=FAULT)  # the control: the steps before the fault only
    assert sorted(snaps) == list(range(FAULT + 1))  # it ran the failing step, then stopped
    assert rep.run["skipped_steps"] == [FAULT] and rep.run["on_fault"] == "stop"
    assert _same(m.state_dict(), m2.state_dict()) and _same(m.state_dict(), snaps[FAULT][0])
    assert _same(opt.state_dict()["state"], opt2.state_dict()["state"])
    assert _same(opt.state_dict()["state"], snaps[FAULT][1]["state"])
    save_file(m.state_dict(), str(tmp_path / "saved.safetensors"))
    assert all(torch.isfinite(t).all() for t in load_file(str(tmp_path / "saved.safetensors")).values())
    f = rep.first_nonfinite
    assert (f.step, f.module, f.op) == (FAULT, "layers.0.act", "aten.exp.default") and f.reproducible is True


def test_stop_without_optimizer_changes_nothing():
    """Without optimizer= the watch sees no step to undo: v1.2, should_stop only."""
    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    with nan_hunter.watch(m, on_fault="stop") as w:
        for (x,) in _batches(5):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
            if w.should_stop:
                break
    assert not all(torch.isfinite(p).all() for p in m.parameters())  # the update ran, as the user's loop did
    assert w.report().run["skipped_steps"] == []


def test_options_are_checked():
    with pytest.raises(ValueError, match="on_fault"):
        nan_hunter.watch(Net(), on_fault="ignore")
    with pytest.raises(ValueError, match="optimizer="):
        nan_hunter.watch(Net(), on_fault="skip")


@pytest.mark.parametrize("level", ["blocks", "modules"])
def test_plain_watch_names_the_leaf_after_the_weights_changed(level):
    """No optimizer= given: the optimizer steps after the fault (NaN weights from then on); the
    report still names the leaf and the op, re-run with the weights of the failing forward."""
    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    with nan_hunter.watch(m, level=level) as w:
        for (x,) in _batches(5):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    assert not all(torch.isfinite(p).all() for p in m.parameters())  # the weights did change after it
    rep = w.report()
    f = rep.first_nonfinite
    assert (f.step, f.module, f.op, f.kind, f.reproducible) == (
        FAULT,
        "layers.0.act",
        "aten.exp.default",
        "posinf",
        True,
    )
    assert rep.diagnosis.cause == "overflow"
    assert not any("parameters changed in place" in n for n in rep.notes)


def test_skip_and_raise_on_the_device_row_sink():
    """The Triton sink (device rows; kernels interpreted on CPU under TRITON_INTERPRET=1, set by
    tests/conftest.py): the same bitwise skip and the same raise."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 or a GPU")
    dev = _triton_device()
    m, opt, rep, _ = _train("adamw", {"on_fault": "skip", "backend": "triton"}, device=dev)
    m2, opt2, _, _ = _train("adamw", None, leave_out=FAULT, device=dev)
    assert rep.run["skipped_steps"] == [FAULT]
    assert _same(m.state_dict(), m2.state_dict()) and _same(
        opt.state_dict()["state"], opt2.state_dict()["state"]
    )
    with pytest.raises(NonFiniteError) as ei:
        _train("sgd_momentum", {"on_fault": "raise", "backend": "triton"}, device=dev)
    assert ei.value.report.first_nonfinite.module == "layers.0.act"


@pytest.fixture
def device_verdicts(monkeypatch):
    """The CUDA path on this CPU (the Triton sink's device rows, interpreted): verdicts as a device sink gives them (rows not read per forward,
    skip decided by a device flag and torch.where, raise after one read-back per step); the CUDA
    event that starts a forward's flag has no CPU counterpart, so that flag is left out."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 or a GPU")
    if os.environ.get("TRITON_INTERPRET") != "1":
        return  # a real GPU: the device path as it is, with its CUDA events
    from nan_hunter.capture.recorder import Recorder  # a watch's recording (session.Watch holds one)

    monkeypatch.setattr(Recorder, "_rows_on_host", lambda self: False)
    monkeypatch.setattr(Recorder, "_flag", lambda self, forward: None)


def test_device_path_skip_is_bitwise(device_verdicts):
    dev = _triton_device()
    m, opt, rep, _ = _train("adamw_foreach", {"on_fault": "skip", "backend": "triton"}, device=dev)
    m2, opt2, _, _ = _train("adamw_foreach", None, leave_out=FAULT, device=dev)
    assert rep.run["skipped_steps"] == [FAULT]
    assert _same(m.state_dict(), m2.state_dict()) and _same(
        opt.state_dict()["state"], opt2.state_dict()["state"]
    )


def test_device_path_stop_is_bitwise_the_last_good_state(device_verdicts):
    """stop with optimizer= on the device path: restored by torch.where on the device, the host-side
    state (AdamW's step counts) through ``_settle``, as skip does."""
    dev = _triton_device()
    m, opt, rep, snaps = _train(
        "adamw_foreach", {"on_fault": "stop", "backend": "triton"}, device=dev, stop=True
    )
    m2, opt2, _, _ = _train("adamw_foreach", None, steps=FAULT, device=dev)
    assert sorted(snaps) == list(range(FAULT + 1)) and rep.run["skipped_steps"] == [FAULT]
    assert _same(m.state_dict(), m2.state_dict()) and _same(
        opt.state_dict()["state"], opt2.state_dict()["state"]
    )


def test_device_path_raise_and_stop_by_the_end_of_the_step(device_verdicts):
    with pytest.raises(NonFiniteError) as ei:
        _train("adamw", {"on_fault": "raise", "backend": "triton"}, device=_triton_device())
    assert (ei.value.report.first_nonfinite.step, ei.value.report.first_nonfinite.module) == (
        FAULT,
        "layers.0.act",
    )
    torch.manual_seed(0)
    m = Net().to(_triton_device())
    with torch.no_grad(), nan_hunter.watch(m, on_fault="stop", backend="triton") as w:
        ran = []
        for s, (x,) in enumerate(_batches(5, device=_triton_device())):
            m(x)
            ran.append(s)
            if w.should_stop:
                break
    assert ran[-1] == FAULT


def test_skip_with_a_closure_optimizer():
    """LBFGS: step(closure) runs forward and backward inside the step (as Lightning does for every
    optimizer); the skipped step is undone, its histories included."""

    def run(watch_kw, leave_out=None):
        torch.manual_seed(0)
        m = Net()
        opt = torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=3, history_size=4)
        w = nan_hunter.watch(m, backward=True, optimizer=opt, **watch_kw) if watch_kw is not None else None
        with w if w is not None else contextlib.nullcontext():
            for s, (x,) in enumerate(_batches(5)):
                if s == leave_out:
                    continue

                def closure(x=x):
                    opt.zero_grad()
                    loss = m(x).pow(2).mean()
                    loss.backward()
                    return loss

                opt.step(closure)
        return m, opt, (w.report() if w is not None else None)

    m, opt, rep = run({"on_fault": "skip"})
    m2, opt2, _ = run(None, leave_out=FAULT)
    # LBFGS runs its closure several times per step: steps are named by their first forward
    assert len(rep.run["skipped_steps"]) == 1 and rep.run["skipped_steps"] == [rep.first_nonfinite.step]
    assert rep.first_nonfinite.module == "layers.0.act"
    assert _same(m.state_dict(), m2.state_dict()) and _same(
        opt.state_dict()["state"], opt2.state_dict()["state"]
    )
