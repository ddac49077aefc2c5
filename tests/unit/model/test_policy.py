"""nan_hunter/model/policy.py: a bisect policy applied to a tiny model — kept modules compute in
their dtype, everything else in the low one, outputs cast back only where they fit."""

from __future__ import annotations

import pytest
import torch
from models.stack6 import HOT, Stack
from torch import nn

from nan_hunter.dtypes import UnknownDtype
from nan_hunter.errors import BadInput
from nan_hunter.model.policy import apply_policy, load_policy, policy_yaml, write_policy

KEEP = {f"layers.{i}": "fp32" for i in HOT}


def pre_dtype(seen: dict, key: str):
    """A forward pre-hook that records its first argument's dtype (and returns None: changes nothing)."""

    def hook(mod, args):
        seen.setdefault(key, args[0].dtype)

    return hook


def out_dtype(seen: dict, key: str):
    def hook(mod, args, out):
        seen.setdefault(key, out.dtype)

    return hook


def stack() -> Stack:
    torch.manual_seed(0)
    return Stack()


def test_the_stack_fails_in_plain_fp16_and_the_policy_makes_it_finite():
    x = torch.full((2, 8), 1.0)
    with torch.no_grad():
        assert not torch.isfinite(stack().half()(x.half())).all()
        ref = stack()(x)
    m = stack()
    h = apply_policy(m, {"dtype": "fp16", "modules": KEEP})
    with torch.no_grad():
        out = m(x.half())
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert torch.allclose(out.float(), ref, atol=1e-2)
    assert h.policy == {"dtype": "fp16", "keep_dtype": "fp32", "modules": KEEP}


def test_kept_modules_hold_and_compute_in_their_dtype_and_hand_back_the_low_one():
    m = stack()
    apply_policy(m, {"dtype": "fp16", "modules": KEEP})
    for i, layer in enumerate(m.layers):
        want = torch.float32 if i in HOT else torch.float16
        assert layer.w.dtype == want and layer.root_gain.dtype == want
    seen: dict[str, torch.dtype] = {}
    # registered after the policy's hooks: sees what the kept module's forward gets and what leaves it
    m.layers[1].register_forward_pre_hook(pre_dtype(seen, "in"))
    m.layers[1].register_forward_hook(out_dtype(seen, "out"))
    m.layers[2].register_forward_pre_hook(pre_dtype(seen, "next_in"))
    with torch.no_grad():
        m(torch.ones(2, 8, dtype=torch.float16))
    assert seen == {"in": torch.float32, "out": torch.float16, "next_in": torch.float16}


class Big(nn.Module):
    def forward(self, x):
        return x * 1e5


class Wrap(nn.Module):
    def __init__(self):
        super().__init__()
        self.big = Big()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.big(self.lin(x)) + 0  # elementwise: type promotion carries a high output on


def test_an_output_that_would_overflow_the_low_dtype_stays_high():
    m = Wrap()
    with torch.no_grad():
        m.lin.weight.copy_(torch.eye(2))
        m.lin.bias.zero_()
    apply_policy(m, {"dtype": "fp16", "modules": {"big": "fp32"}})
    with torch.no_grad():
        out = m(torch.ones(1, 2, dtype=torch.float16))
    assert out.dtype == torch.float32 and torch.equal(out, torch.full((1, 2), 1e5))
    with torch.no_grad():
        small = m(torch.full((1, 2), 1e-3, dtype=torch.float16))
    assert small.dtype == torch.float16  # fits fp16: cast back down


def test_a_nested_kept_module_hands_back_its_kept_parents_dtype():
    m = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), nn.Linear(2, 2))
    apply_policy(m, {"dtype": "bf16", "modules": {"0": "fp32", "0.1": "fp64"}})
    assert m[0][0].weight.dtype == torch.float32 and m[0][1].weight.dtype == torch.float64
    assert m[1].weight.dtype == torch.bfloat16
    seen = {}
    m[0][1].register_forward_hook(out_dtype(seen, "inner"))
    m[0].register_forward_hook(out_dtype(seen, "outer"))
    with torch.no_grad():
        out = m(torch.ones(1, 2, dtype=torch.bfloat16))
    assert seen == {"inner": torch.float32, "outer": torch.bfloat16} and out.dtype == torch.bfloat16


def test_remove_takes_every_casting_hook_off():
    m = stack()
    h = apply_policy(m, {"dtype": "fp16", "modules": KEEP})
    assert len(h.handles) == 2 * len(KEEP)
    h.remove()
    assert h.handles == []
    assert all(not s._forward_pre_hooks and not s._forward_hooks for s in m.modules())
    with pytest.raises(RuntimeError):  # without the hooks, fp16 activations meet fp32 weights
        with torch.no_grad():
            m(torch.ones(2, 8, dtype=torch.float16))


def test_policy_file_round_trip(tmp_path):
    text = policy_yaml("fp16", "fp32", ["layers.1", "layers.4"])
    assert text.startswith("# written by nanhunter bisect") and "nanhunter_policy: 1" in text
    p = tmp_path / "policy.yaml"
    write_policy(str(p), "fp16", "fp32", ["layers.1", "layers.4"])
    assert p.read_text() == text
    assert load_policy(p) == {"dtype": "fp16", "keep_dtype": "fp32", "modules": KEEP}
    assert load_policy(str(p)) == load_policy(p)


def test_load_policy_defaults_and_aliases():
    assert load_policy({}) == {"dtype": "fp16", "keep_dtype": "fp32", "modules": {}}
    assert load_policy({"dtype": "half", "keep_dtype": "float32", "modules": {"a": "bfloat16"}}) == {
        "dtype": "fp16",
        "keep_dtype": "fp32",
        "modules": {"a": "bf16"},
    }


def test_bad_policies_are_refused(tmp_path):
    with pytest.raises(BadInput, match="file not found"):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("modules: [a, b]\n")
    with pytest.raises(BadInput, match="expected a mapping"):
        load_policy(bad)
    bad.write_text("- 1\n")
    with pytest.raises(BadInput, match="expected a mapping"):
        load_policy(bad)
    with pytest.raises(UnknownDtype, match="unknown dtype 'fp12'"):
        load_policy({"modules": {"a": "fp12"}})
    with pytest.raises(BadInput, match="module 'layers.9' is not in this model"):
        apply_policy(stack(), {"modules": {"layers.9": "fp32"}})


@pytest.mark.parametrize(
    "policy, key",
    [({"keep": {"layers.1": "fp32"}}, "keep"), ({"module": {"layers.1": "fp32"}, "dtype": "fp16"}, "module")],
)
def test_an_unknown_key_is_refused_not_ignored(policy, key):
    """Found by tests/unit/test_init.py: ``{"keep": {...}}`` was read as an empty policy, so
    apply_policy cast the whole model to fp16 and kept nothing, without a word."""
    m = stack()
    before = {n: p.dtype for n, p in m.named_parameters()}
    with pytest.raises(
        BadInput,
        match=f"policy: unknown key '{key}' \\(a policy has nanhunter_policy, dtype, keep_dtype, modules\\)",
    ):
        apply_policy(m, policy)
    assert {n: p.dtype for n, p in m.named_parameters()} == before
