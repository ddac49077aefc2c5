"""nan_hunter/modes/registry.py: the one place options become a mode."""

from __future__ import annotations

from nan_hunter.modes.backward import BackwardMode
from nan_hunter.modes.forward import ForwardMode
from nan_hunter.modes.generate import GenerateMode
from nan_hunter.modes.registry import mode_for


def test_no_option_is_one_forward_per_input():
    m = mode_for()
    assert isinstance(m, ForwardMode) and m.name == "forward" and not m.one_step_table


def test_generate_carries_its_token_count_and_batching():
    m = mode_for(generate=5)
    assert isinstance(m, GenerateMode) and m.name == "generate" and m.one_step_table
    assert (m.max_new_tokens, m.batched, m.pad_id) == (5, False, None)
    assert mode_for(generate=3, batch=True).batched is True


def test_backward_carries_the_loss_spec_and_no_loss_before_check():
    m = mode_for(backward=True, loss="loss.py:fn")
    assert isinstance(m, BackwardMode) and m.name == "backward"
    assert m.loss_spec == "loss.py:fn" and m.loss is None
    assert mode_for(backward=True).loss_spec is None


def test_backward_is_chosen_before_generate():
    # ScanOptions refuses the combination; the registry's order is still backward first
    assert isinstance(mode_for(generate=4, backward=True), BackwardMode)


def test_each_call_gives_a_fresh_mode():
    assert mode_for(generate=2) is not mode_for(generate=2)


def test_every_registered_mode_is_a_mode_and_the_last_takes_any_request():
    from nan_hunter.modes.registry import MODES, ModeRequest

    for cls in MODES:
        for attr in (
            "wanted",
            "from_request",
            "check",
            "run_input",
            "rerun",
            "place",
            "name",
            "grad",
            "compares_outputs",
        ):
            assert hasattr(cls, attr), f"{cls.__name__} lacks {attr}"
    assert MODES[-1].wanted(ModeRequest(generate=3, backward=True, batch=True))


def test_a_new_mode_is_one_class_and_one_registration(monkeypatch):
    """Options select a new mode through the registry alone: no caller changes."""
    from nan_hunter.modes import registry

    class Sampled(ForwardMode):
        name = "sampled"

        @classmethod
        def wanted(cls, request):
            return request.generate == 0

        @classmethod
        def from_request(cls, request):
            return cls()

    monkeypatch.setattr(registry, "MODES", (Sampled, *registry.MODES))
    assert isinstance(mode_for(generate=0), Sampled)
    assert isinstance(mode_for(generate=2), GenerateMode)
