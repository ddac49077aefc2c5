"""``locate.first_fault``: the one locate. ``faulted_again``: a step's re-run judged by the one
comparison of recordings against the failing forward."""

from __future__ import annotations

from nan_hunter.capture.records import Call
from nan_hunter.kernels.stats import TensorStats
from nan_hunter.locate.first_fault import faulted_again


def _calls(kinds: list[str | None]) -> tuple[list[Call], list[TensorStats]]:
    calls, rows = [], []
    for i, kind in enumerate(kinds):
        rows.append(TensorStats(numel=4, nan=int(kind == "nan"), posinf=int(kind == "posinf"), absmax=1.0))
        c = Call(i, f"m{i}", "Linear", 0, 1, None, 3, outputs=[("out", i)], seq=i)
        calls.append(c)
    return calls, rows


def test_the_same_fault_again():
    orig, rerun = _calls([None, "posinf", "nan"]), _calls([None, "posinf", "nan"])
    assert faulted_again(*orig, *rerun) is True


def test_a_finite_rerun_or_another_class_is_not_the_fault_again():
    orig = _calls([None, "posinf", "nan"])
    assert faulted_again(*orig, *_calls([None, None, None])) is False
    assert faulted_again(*orig, *_calls([None, "nan", "nan"])) is False


def test_no_fault_recorded_leaves_the_rerun_to_decide():
    assert faulted_again(*_calls([None]), *_calls([None])) is True
