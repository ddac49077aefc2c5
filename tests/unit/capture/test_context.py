"""``capture.context``: the ambient state a forward ran under (``ForwardContext``: grad and
inference mode, autocast, train/eval mode, the RNG), entered again for a re-run, and the two guards
every re-run runs inside — the user's autocast switched off (``outside_users_autocast``) and the
user's RNG, buffers and train/eval modes put back (``users_state_kept``)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from nan_hunter.capture.context import ForwardContext, outside_users_autocast, users_state_kept


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))


# --- ForwardContext.now ------------------------------------------------------------------------------


def test_now_captures_grad_mode():
    with torch.no_grad():
        off = ForwardContext.now()
    with torch.enable_grad():
        on = ForwardContext.now()
    assert off.grad is False and on.grad is True
    assert off.inference is False and on.inference is False
    assert off.autocast == () and off.training is None  # no model: no train/eval mode


def test_now_captures_inference_mode():
    with torch.inference_mode():
        ctx = ForwardContext.now()
    assert ctx.inference is True and ctx.grad is False


def test_now_captures_cpu_autocast_and_its_dtype():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ctx = ForwardContext.now()
    assert ctx.autocast == (("cpu", torch.bfloat16),)
    with torch.autocast("cpu", dtype=torch.float16):
        assert ForwardContext.now().autocast == (("cpu", torch.float16),)
    assert ForwardContext.now().autocast == ()


def test_now_captures_the_models_train_or_eval_mode():
    m = _net()
    assert ForwardContext.now(m.train()).training is True
    assert ForwardContext.now(m.eval()).training is False


def test_now_captures_the_rng_state_so_seed_replays_the_same_draws():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    ctx = ForwardContext.now()
    assert torch.equal(ctx.rng, before)
    first = torch.rand(5)
    torch.rand(100)  # the generator moves on; the recorded state does not
    assert torch.equal(ctx.rng, before)
    ctx.seed()
    assert torch.equal(torch.rand(5), first)
    if not torch.cuda.is_initialized():
        assert ctx.cuda_rng is None  # no CUDA RNG is read before CUDA is initialised


def test_seed_without_a_state_leaves_the_rng_alone():
    torch.manual_seed(5)
    state = torch.get_rng_state()
    ForwardContext(grad=False, autocast=()).seed()
    assert torch.equal(torch.get_rng_state(), state)


# --- ForwardContext.enter ----------------------------------------------------------------------------


def test_enter_restores_grad_mode_as_recorded():
    with torch.no_grad():
        ctx = ForwardContext.now()
    with contextlib.ExitStack() as stack:
        ctx.enter(stack)
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()
    on = ForwardContext(grad=True, autocast=())
    with torch.no_grad(), contextlib.ExitStack() as stack:
        on.enter(stack)
        assert torch.is_grad_enabled()


def test_enter_restores_inference_mode():
    with torch.inference_mode():
        ctx = ForwardContext.now()
    with contextlib.ExitStack() as stack:
        ctx.enter(stack)
        assert torch.is_inference_mode_enabled()
        assert torch.ones(2).is_inference()
    assert not torch.is_inference_mode_enabled()


def test_enter_restores_autocast_without_the_cast_cache():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ctx = ForwardContext.now()
    lin = nn.Linear(4, 4)
    x = torch.ones(2, 4)
    with contextlib.ExitStack() as stack:
        ctx.enter(stack)
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert not torch.is_autocast_cache_enabled()
        assert lin(x).dtype == torch.bfloat16  # the forward computes as it did
    assert not torch.is_autocast_enabled("cpu")
    assert lin(x).dtype == torch.float32


# --- outside_users_autocast ----------------------------------------------------------------------------


def test_outside_users_autocast_switches_it_off_and_gives_it_back():
    lin = nn.Linear(4, 4)
    x = torch.ones(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16
        with outside_users_autocast():
            assert not torch.is_autocast_enabled("cpu")
            assert lin(x).dtype == torch.float32  # a replay's fp32 column really is fp32
            # a re-run inside enters its own recorded autocast
            with contextlib.ExitStack() as stack:
                ForwardContext(grad=False, autocast=(("cpu", torch.float16),)).enter(stack)
                assert lin(x).dtype == torch.float16
            assert lin(x).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert lin(x).dtype == torch.bfloat16


def test_outside_users_autocast_without_autocast_changes_nothing():
    with outside_users_autocast():
        assert not torch.is_autocast_enabled("cpu")
        assert torch.is_grad_enabled()
    assert not torch.is_autocast_enabled("cpu")


def test_outside_users_autocast_gives_it_back_when_the_body_raises():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(ZeroDivisionError), outside_users_autocast():
            1 / 0  # noqa: B018
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


# --- users_state_kept --------------------------------------------------------------------------------


def test_users_state_kept_restores_rng_buffers_and_modes():
    m = _net().train()
    m[2].eval()  # a mixed tree: each module's own mode comes back, not one flag for all
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    stats = [b.clone() for b in m.buffers()]
    with users_state_kept(m):
        m.train()
        m(torch.randn(8, 4) * 5)  # train-mode BatchNorm updates its running statistics
        assert not all(torch.equal(a, b) for a, b in zip(stats, m.buffers()))
        m.eval()
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(a, b) for a, b in zip(stats, m.buffers()))
    assert [mod.training for mod in m.modules()] == [True, True, True, False]


def test_users_state_kept_restores_them_when_the_rerun_raises():
    m = _net().eval()
    torch.manual_seed(9)
    rng = torch.get_rng_state()
    running = m[1].running_mean.clone()
    with pytest.raises(RuntimeError, match="boom"), users_state_kept(m):
        m.train()
        m(torch.randn(8, 4) + 3)
        torch.rand(10)
        raise RuntimeError("boom")
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(m[1].running_mean, running)
    assert not any(mod.training for mod in m.modules())


def test_users_state_kept_writes_back_into_the_same_buffer_objects():
    m = _net().train()
    buf = m[1].running_var
    before = buf.clone()
    with users_state_kept(m):
        m(torch.randn(8, 4) * 3)
    assert m[1].running_var is buf and torch.equal(buf, before)


def test_users_state_kept_restores_buffers_made_in_inference_mode():
    with torch.inference_mode():
        m = _net().train()
        before = m[1].running_mean.clone()
        assert m[1].running_mean.is_inference()
        with users_state_kept(m):
            m(torch.randn(8, 4) * 4)
            assert not torch.equal(m[1].running_mean, before)
        assert torch.equal(m[1].running_mean, before)
