"""watch()'s fix checked on a fresh copy of the whole model (contract v1.4 ``fix_verified.scope``):
the failing step's kept inputs, the weights it ran with, its train/eval mode and its RNG (dropout),
every copy cast from those weights; ``scope`` is ``"model"`` only then, and the verified policy,
re-applied with plain torch by the fix oracle (``tests/oracle/fix_apply.with_policy``), makes the
model's outputs finite and within 0.05 of fp32. The user's model, optimizer and RNG are left as they
were. Under autocast the failing module is checked alone, and the report says so (``"region"``)."""

from __future__ import annotations

import copy

import torch
from oracle import fix_apply as O  # tests/ is on sys.path
from torch import nn

import nan_hunter

RTOL = 0.05


class Net(nn.Module):
    """up → relu → dropout → down → head; ``down``'s output passes fp16's max on a large input (its
    weights ×2000), ``head`` (weights ×1e-3) brings it back into range: fine in fp32."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.up, self.drop, self.down, self.head = (
            nn.Linear(4, 8),
            nn.Dropout(p),
            nn.Linear(8, 4),
            nn.Linear(4, 2),
        )
        torch.manual_seed(0)
        for m in (self.up, self.down, self.head):
            nn.init.uniform_(m.weight, 0.5, 1.0)
            nn.init.zeros_(m.bias)
        with torch.no_grad():
            self.down.weight.mul_(2000.0)
            self.head.weight.mul_(1e-3)

    def forward(self, x):
        return self.head(self.down(self.drop(torch.relu(self.up(x)))))


X = torch.full((2, 4), 3.0)  # down's output ~1e5 in fp32: past fp16's max


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _oracle_holds(net32: nn.Module, x: torch.Tensor, fv) -> float:
    """The verified policy re-applied by the fix oracle to a copy of the fp32 model: its relative error."""
    assert fv.applied_as["kind"] == "policy", fv
    with torch.no_grad():
        ref = [net32.eval()(x)]
        m = O.with_policy(net32, O.DTYPES[fv.applied_as["dtype"]], fv.applied_as["policy"])
        outs = [m(x.to(O.DTYPES[fv.applied_as["dtype"]]))]
    ok, err = O.judge([o.float() for o in outs], ref, RTOL)
    assert ok, (fv.applied_as, err)
    return err


def test_an_eval_fault_is_verified_on_the_whole_model_and_the_oracle_agrees():
    net32 = Net().eval()
    net16 = copy.deepcopy(net32).half()
    before = {k: v.clone() for k, v in net16.state_dict().items()}
    rng = torch.get_rng_state()
    with nan_hunter.watch(net16) as w, torch.no_grad():
        net16(X.half())
    d = w.report().diagnosis
    fv = d.fix_verified
    assert d.cause == "overflow" and d.module == "down", d
    assert fv is not None and fv.scope == "model" and fv.finite, fv
    assert set(fv.applied_as["policy"]) == {
        "down",
        "head",
    }  # down alone leaves fp32 activations for an fp16 head
    assert "Verified" in d.fix
    _oracle_holds(net32, X, fv)
    assert all(torch.equal(v, before[k]) and v.dtype == torch.float16 for k, v in net16.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_training_fault_is_verified_on_the_failing_steps_forward_with_its_weights_and_dropout():
    """A train-mode step (dropout on) with an optimizer: the fix is checked on the forward of the
    failing step as it ran (its weights, its dropout mask); the optimizer's state, the model and the
    RNG are as the loop left them."""
    net16 = Net(p=0.25).half().train()
    opt = torch.optim.SGD(net16.parameters(), lr=1e-6, momentum=0.9)
    with nan_hunter.watch(net16, optimizer=opt) as w:
        for step in range(3):
            x = (X if step == 2 else X / 1000).half()
            loss = net16(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    state = {k: v.clone() for k, v in net16.state_dict().items()}
    opt_state = copy.deepcopy(opt.state_dict())
    rng = torch.get_rng_state()
    rep = w.report()
    d, f = rep.diagnosis, rep.first_nonfinite
    assert f.step == 2 and f.phase == "forward" and d.module == "down", (f, d)
    fv = d.fix_verified
    assert fv is not None and fv.scope == "model" and fv.finite, fv
    assert {"down", "head"} <= set(fv.applied_as["policy"])
    assert all(
        _same_bits(v, state[k]) for k, v in net16.state_dict().items()
    )  # NaN after the bad step's update
    assert str(opt.state_dict()) == str(opt_state) and torch.equal(torch.get_rng_state(), rng)
    assert net16.training


def test_under_autocast_the_failing_module_is_checked_alone_and_says_so():
    """A copy cast to the autocast dtype is not the run the user made: scope "region", never "verified"."""
    net = Net().eval()
    with nan_hunter.watch(net) as w, torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        net(X)
    d = w.report().diagnosis
    fv = d.fix_verified
    if fv is not None:
        assert fv.scope == "region", fv
    assert "Verified" not in d.fix
