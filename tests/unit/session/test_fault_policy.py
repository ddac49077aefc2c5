"""nan_hunter/session/fault_policy.py, the parts around the training loop: option checks, the
verdict line of ``NonFiniteError``, first-fault reactions, step labels and the report's fields.
(Skip's bitwise restore, raise and stop inside real loops: tests/integration/test_on_fault.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.errors import NonFiniteError
from nan_hunter.report import Diagnosis, FirstNonfinite, Report, RunInfo
from nan_hunter.session.fault_policy import ON_FAULT, OnFault, verdict_line
from nan_hunter.session.watcher import Watch


def fnf(op: str | None = "aten.exp.default", module: str = "layers.0.act", step: int = 3) -> FirstNonfinite:
    return FirstNonfinite(
        input_index=0,
        module=module,
        module_type="Act",
        op=op,
        kind="nan",
        role="producer",
        step=step,
        phase="backward",
    )


def test_verdict_line_names_kind_step_phase_op_module_and_cause():
    assert verdict_line(Report()) == "nanhunter: a non-finite value was seen"
    assert (
        verdict_line(Report(first_nonfinite=fnf()))
        == "nanhunter: first non-finite value (nan) at step 3, backward: aten.exp.default in layers.0.act"
    )
    assert verdict_line(Report(first_nonfinite=fnf(op=None, module=""))).endswith("backward: <root>")
    assert verdict_line(Report(first_nonfinite=fnf(op="aten.mul.Tensor", module=""))).endswith(
        "aten.mul.Tensor in <root>"
    )
    d = Diagnosis(
        cause="overflow", dtype="fp16", module=None, op=None, summary="too big", evidence=[], fix=""
    )
    assert verdict_line(Report(first_nonfinite=fnf(), diagnosis=d)).endswith(
        "layers.0.act (overflow: too big)"
    )


def test_options_are_checked_before_anything_is_hooked():
    m = nn.Linear(2, 2)
    with pytest.raises(
        ValueError, match=r"on_fault must be one of \('record', 'raise', 'skip', 'stop', 'abort'\)"
    ):
        Watch(m, on_fault="ignore")
    with pytest.raises(ValueError, match="needs optimizer="):
        Watch(m, on_fault="skip")
    assert ON_FAULT == ("record", "raise", "skip", "stop", "abort")
    assert not m._forward_hooks and not m._forward_pre_hooks
    assert Watch(m, on_fault="stop").policy.kind is OnFault.STOP


def test_each_policy_says_what_it_asks_of_the_watch():
    """The one place a policy's behaviour is decided (the watch and the callbacks ask, never compare names)."""
    table = {
        p: (
            p.needs_optimizer,
            p.stops,
            p.raises,
            p.reads_each_step,
            p.undoes_faulty_steps(False),
            p.undoes_faulty_steps(True),
        )
        for p in OnFault
    }
    assert table == {
        OnFault.RECORD: (False, False, False, False, False, False),
        OnFault.RAISE: (False, False, True, True, False, False),
        OnFault.SKIP: (True, False, False, False, True, True),
        OnFault.STOP: (False, True, False, True, False, True),  # stop with optimizer= undoes the step too
        OnFault.ABORT: (False, False, False, False, False, False),  # serving: ends a request, not the loop
    }
    assert [p for p in OnFault if p.aborts_requests] == [OnFault.ABORT]
    assert Watch(nn.Linear(2, 2), on_fault="abort").serving.abort
    assert OnFault.parse("skip", has_optimizer=True) is OnFault.SKIP
    assert OnFault.parse(OnFault.STOP, has_optimizer=False) is OnFault.STOP
    with pytest.raises(ValueError, match=r"on_fault must be one of .* got 'Raise'"):
        OnFault.parse("Raise", has_optimizer=True)
    with pytest.raises(ValueError, match="needs optimizer="):
        OnFault.parse("skip", has_optimizer=False)


@pytest.mark.parametrize("on_fault, stops", [("record", False), ("stop", True)])
def test_first_fault_sets_should_stop_only_under_stop(on_fault, stops):
    w = Watch(nn.Linear(2, 2), on_fault=on_fault)
    w.policy.on_first_fault(0, "forward")
    assert w.should_stop is stops and w.policy.should_stop is stops


def test_raise_raises_once_with_this_ranks_report():
    w = Watch(nn.Linear(2, 2), on_fault="raise")
    w.collective = True
    with pytest.raises(NonFiniteError) as e:
        w.policy.on_first_fault(0, "forward")
    assert str(e.value) == "nanhunter: a non-finite value was seen"  # nothing captured: no finding
    assert e.value.report.first_nonfinite is None
    assert w.collective is True  # the local report put the flag back
    assert not w.should_stop
    w.policy.on_first_fault(1, "backward")  # a second fault: not raised again


def test_labels_map_forwards_to_the_framework_step_that_began_at_or_before_them():
    p = Watch(nn.Linear(2, 2)).policy
    assert p.label(7) == 7  # no framework: the forward index itself
    p.step_label = {0: 100, 4: 101, 8: 102}
    assert [p.label(f) for f in (0, 3, 4, 7, 8, 20)] == [100, 100, 101, 101, 102, 102]
    p.step_label = {2: 50}
    assert p.label(1) == 1  # before any labelled step: unchanged


def test_finish_writes_on_fault_and_skipped_steps_and_relabels_the_step():
    p = Watch(nn.Linear(2, 2), on_fault="stop").policy
    p.skipped = [4]  # only "skip" reports skipped steps
    rep = Report(run=RunInfo(dtype=None, device="cpu", n_inputs=1), first_nonfinite=fnf(step=5))
    p.step_label = {0: 10, 4: 11}
    p.finish(rep)
    assert rep.run.on_fault == "stop" and rep.run.skipped_steps == []
    assert rep.first_nonfinite.step == 11


def test_skip_reports_its_host_skips_in_framework_steps():
    m = nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    p = Watch(m, optimizer=opt, on_fault="skip").policy
    p.skipped = [6, 2]
    assert p.skipped_steps() == [2, 6]
    p.step_label = {0: 1, 2: 2, 6: 4}
    rep = Report(run=RunInfo(dtype=None, device="cpu", n_inputs=1))
    p.finish(rep)
    assert rep.run.skipped_steps == [2, 4] and rep.run.on_fault == "skip"
