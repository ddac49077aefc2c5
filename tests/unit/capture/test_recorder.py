"""``capture.recorder.Recorder`` on small real models: which modules each level hooks, hooks always
removed (a model that raises included), one ``Call`` per module call with stats rows that are the
tensors' own, outputs bitwise unchanged, steps per root call, folding of old forwards into
aggregates with the first failing one kept in full, parameters measured again after an in-place
change, and the producer rule's data check (NaN/+inf data fails a forward, a −inf mask does not).
``test_recorder_api.py`` covers the API for collaborators (``first_step``, ``measure``...)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from nan_hunter.capture.listener import Companion, KeepSteps
from nan_hunter.capture.recorder import LEVELS, ModuleAggregate, Recorder
from nan_hunter.capture.records import Call


class Net(nn.Module):
    """Three blocks in a ModuleList (the main blocks), a head, and a module called twice."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(3))
        self.head = nn.Linear(4, 2)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = self.act(layer(x))
        return self.act(self.head(x))


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lin(x)
        raise RuntimeError("the user's model failed")


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _run(model: nn.Module, xs: list[torch.Tensor], **kw) -> Recorder:
    rec = Recorder(model, **kw)
    with rec, torch.no_grad():
        for x in xs:
            model(x)
    return rec


# --- hooks --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_hooks_installed_while_attached_and_removed_after(level):
    m = Net()
    n_modules = len(list(m.modules()))
    rec = Recorder(m, level=level)
    with rec:
        # blocks: the root and the three layers; sentinel: the root alone
        expected = {"blocks": 1 + 3, "sentinel": 1}.get(level, n_modules)
        assert _hooks(m) == 2 * expected  # one pre-hook and one forward hook each
    assert _hooks(m) == 0


def test_attach_twice_installs_the_hooks_once():
    m = Net()
    rec = Recorder(m, level="modules")
    rec.attach()
    rec.attach()
    try:
        assert _hooks(m) == 2 * len(list(m.modules()))
    finally:
        rec.detach()
    assert _hooks(m) == 0


@pytest.mark.parametrize("level", LEVELS)
def test_hooks_removed_when_the_model_raises(level):
    m = Boom()
    with pytest.raises(RuntimeError, match="the user's model failed"), Recorder(m, level=level):
        m(torch.ones(1, 4))
    assert _hooks(m) == 0
    assert _get_current_dispatch_mode() is None  # no op-level dispatch mode left behind


def test_a_recorder_reattached_after_a_failed_forward_records_a_clean_step():
    m = Boom()
    rec = Recorder(m, level="modules")
    with pytest.raises(RuntimeError), rec:
        m(torch.ones(1, 4))
    m.forward = lambda x: m.lin(x)  # the model fixed: the next forward returns
    with rec, torch.no_grad():
        m(torch.ones(1, 4))
    assert rec.n_forwards == 2
    step1 = rec.calls_of(1)
    assert [c.module for c in step1] == ["", "lin"] and step1[0].depth == 0 and step1[0].parent is None


# --- what is recorded ---------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_outputs_are_bitwise_equal_with_and_without_capture(level):
    m = Net().eval()
    x = torch.randn(5, 4)
    with torch.no_grad():
        plain = m(x)
        with Recorder(m, level=level):
            watched = m(x)
    assert torch.equal(plain, watched)


def test_level_modules_records_one_call_per_module_call():
    m = Net()
    x = torch.randn(2, 4)
    rec = _run(m, [x], level="modules")
    calls = rec.calls
    assert all(isinstance(c, Call) and c.input_index == 0 and c.phase == "forward" for c in calls)
    names = [c.module for c in calls]  # pre-hook order
    assert names[:4] == ["", "layers.0", "layers.0.0", "layers.0.1"]
    assert names.count("act") == 4 and [c.call_index for c in calls if c.module == "act"] == [0, 1, 2, 3]
    assert len(calls) == 1 + 3 * 3 + 4 + 1  # root, three blocks of two, act four times, head
    by_start = {c.start: c for c in calls}
    root = calls[0]
    assert root.depth == 0 and root.parent is None and root.module_type == "Net"
    lin = calls[2]
    assert lin.module_type == "Linear" and lin.depth == 2 and by_start[lin.parent].module == "layers.0"
    # seq is the post-hook order: innermost first, the root last
    assert root.seq == max(c.seq for c in calls)
    assert lin.seq < by_start[lin.parent].seq


def test_rows_hold_the_statistics_of_the_call_inputs_outputs_and_params():
    m = Net()
    x = torch.randn(2, 4) * 3
    seen: dict[str, torch.Tensor] = {}
    handle = m.layers[1][0].register_forward_hook(lambda mod, a, out: seen.update(inp=a[0], out=out))
    try:
        rec = _run(m, [x], level="modules")
    finally:
        handle.remove()
    rows = rec.stats()
    lin = next(c for c in rec.calls if c.module == "layers.1.0")
    ((_, rin),) = lin.inputs
    ((_, rout),) = lin.outputs
    assert rows[rin].absmax == pytest.approx(float(seen["inp"].abs().max()))
    assert rows[rout].absmax == pytest.approx(float(seen["out"].abs().max()))
    assert rows[rout].numel == seen["out"].numel() and rows[rout].finite
    params = dict(lin.params)
    assert set(params) == {"weight", "bias"}  # its own parameters only at level modules
    assert rows[params["weight"]].absmax == pytest.approx(float(m.layers[1][0].weight.detach().abs().max()))
    root = rec.calls[0]
    assert rows[root.inputs[0][1]].absmax == pytest.approx(float(x.abs().max()))


def test_level_blocks_records_the_root_and_the_blocks_with_their_subtrees_parameters():
    m = Net()
    rec = _run(m, [torch.randn(2, 4)], level="blocks")
    assert [c.module for c in rec.calls] == ["", "layers.0", "layers.1", "layers.2"]
    block = rec.calls[1]
    assert [label for label, _ in block.params] == ["0.weight", "0.bias"]  # the Linear inside it
    root = rec.calls[0]
    assert [label for label, _ in root.params] == ["head.weight", "head.bias"]  # outside every block


def test_level_ops_records_a_non_finite_op_absorbed_before_any_module_output():
    class Absorbs(nn.Module):
        def forward(self, x):
            h = torch.log(x - 1)  # NaN for x < 1
            return torch.nan_to_num(h, nan=0.0)

    m = Absorbs()
    rec = _run(m, [torch.tensor([0.5, 2.0])], level="ops")
    assert rec.first_failed is None  # no module output is non-finite
    ops = [ev.op for ev in rec.op_records]
    assert "aten.log.default" in ops
    ev = rec.op_records[ops.index("aten.log.default")]
    assert ev.kind == "nan" and ev.nan == 1
    assert _run(Absorbs(), [torch.tensor([0.5, 2.0])], level="modules").op_records == []


def test_each_root_call_is_one_step():
    m = Net()
    rec = _run(m, [torch.randn(2, 4) for _ in range(3)], level="modules", retain=4)
    assert rec.n_forwards == 3 and rec.current_step == 2
    assert sorted({c.input_index for c in rec.calls}) == [0, 1, 2]
    assert [c.module for c in rec.calls_of(1)][0] == ""


def test_paused_records_nothing():
    m = Net()
    rec = Recorder(m, level="modules")
    with rec, torch.no_grad():
        rec.paused = True
        m(torch.randn(2, 4))
        rec.paused = False
        m(torch.randn(2, 4))
    assert rec.n_forwards == 1 and {c.input_index for c in rec.calls} == {0}


def test_the_stats_device_is_the_models_or_cpu():
    only_buffers = nn.Module()
    only_buffers.register_buffer("scale", torch.ones(2))
    assert Recorder(only_buffers).sink.device.type == "cpu"
    assert Recorder(nn.ReLU()).sink.device == torch.device("cpu")  # no tensors at all
    assert Recorder(Net(), device="cpu").sink.device.type == "cpu"


def test_a_companion_is_attached_and_detached_with_the_recorder():
    class Seen(Companion):
        def __init__(self) -> None:
            self.events: list[str] = []

        def attach(self) -> None:
            self.events.append("attach")

        def detach(self) -> None:
            self.events.append("detach")

    m = Net()
    rec = Recorder(m, level="modules")
    early = Seen()
    rec.add_companion(early)
    assert early.events == []  # not attached until the recorder is
    with rec:
        late = Seen()
        rec.add_companion(late)  # attached at once: the recorder is
        assert early.events == ["attach"] and late.events == ["attach"]
    assert early.events == ["attach", "detach"] and late.events == ["attach", "detach"]


class _RootSeen(Companion):
    """A companion with root callbacks: what it sees of the recorder at each."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.events: list[tuple] = []

    def root_start(self, args: tuple, kwargs: dict) -> None:
        self.events.append(("start", self.rec.current_step, len(args)))

    def root_end(self, args: tuple, kwargs: dict, output: Any) -> None:
        self.events.append(("end", self.rec.current_step, self.rec.finite_outputs))


@pytest.mark.parametrize("level", ["sentinel", "blocks"])
def test_companions_run_inside_the_recorders_one_root_hook_pair(level):
    """The root has one pre-hook and one post-hook whoever watches it: a companion's root
    callbacks run inside them, after the recorder's part (the step it started; at the end the
    sentinel's verdict on the outputs); a companion without them adds no call."""
    m = Net()
    rec = Recorder(m, level=level)
    seen = _RootSeen(rec)
    rec.add_companion(seen)
    rec.add_companion(Companion())  # no root callbacks: never called per step
    assert rec._root_starts_of == [seen.root_start] and rec._root_ends_of == [seen.root_end]
    with rec, torch.no_grad():
        assert len(m._forward_pre_hooks) == 1 and len(m._forward_hooks) == 1
        m(torch.randn(2, 4))
        m(torch.randn(2, 4))
    assert not m._forward_pre_hooks and not m._forward_hooks
    finite = [0, 1] if level == "sentinel" else [None, None]  # only the sentinel reduces the outputs
    assert seen.events == [
        ("start", 0, 1),
        ("end", 0, finite[0]),
        ("start", 1, 1),
        ("end", 1, finite[1]),
    ]


def test_a_recorder_that_captures_nothing_hooks_the_root_for_its_companions_only():
    m = Net()
    rec = Recorder(m, capture=False)
    with rec:
        assert not m._forward_pre_hooks  # nothing to call at a root call
    seen = _RootSeen(rec)
    rec.add_companion(seen)
    with rec, torch.no_grad():
        assert len(m._forward_pre_hooks) == 1
        m(torch.randn(2, 4))
    assert [e[0] for e in seen.events] == ["start", "end"] and rec.n_forwards == 0  # no step recorded


# --- folding and the first failing forward -----------------------------------------------------------


def test_older_forwards_fold_into_aggregates_and_the_latest_retain_are_kept():
    m = Net()
    xs = [torch.full((1, 4), float(i + 1)) for i in range(5)]
    tops = []
    h = m.head.register_forward_hook(lambda mod, a, out: tops.append(float(out.abs().max())))
    try:
        rec = _run(m, xs, level="modules", retain=2)
    finally:
        h.remove()
    assert rec.forwards_folded == 3
    assert sorted({c.input_index for c in rec.calls}) == [3, 4]
    assert rec.calls_of(0) is None and rec.calls_of(4) is not None
    agg = rec.aggregates["head"]
    assert isinstance(agg, ModuleAggregate) and agg.module_type == "Linear"
    assert agg.calls == 3 and agg.nonfinite_calls == 0
    assert agg.absmax == pytest.approx(max(tops[:3]))
    assert rec.aggregates["act"].calls == 3 * 4  # a module called four times per forward
    assert agg.to_dict()["module"] == "head"


def test_the_first_failing_forward_is_kept_in_full_with_its_inputs():
    m = Net()
    xs = [torch.ones(1, 4)] * 2 + [torch.full((1, 4), float("nan"))] + [torch.ones(1, 4)] * 3
    bad = xs[2]
    rec = _run(m, xs, level="modules", retain=1, listener=KeepSteps(m))
    assert rec.first_failed == 2 and rec.failed_forwards() == [2]
    assert rec.calls_of(2) is not None and rec.calls_of(5) is not None
    assert rec.calls_of(0) is None and rec.calls_of(3) is None  # folded
    snap = rec.inputs_of(2)
    assert snap is not None
    args, _ = snap.rerun()
    assert args[0] is not bad and args[0].shape == bad.shape and torch.isnan(args[0]).all()  # a copy
    assert [f for f, _ in rec.retained] == [2]  # a host sink keeps only the first failing forward's inputs
    rows = rec.stats()
    head = next(c for c in rec.calls_of(2) if c.module == "head")
    assert rows[head.outputs[0][1]].nan == 2


def test_later_failing_forwards_are_counted_in_the_aggregates():
    m = Net()
    nan = torch.full((1, 4), float("nan"))
    xs = [nan, torch.ones(1, 4), nan, nan, torch.ones(1, 4), torch.ones(1, 4)]
    rec = _run(m, xs, level="modules", retain=1)
    assert rec.first_failed == 0 and rec.failed_forwards() == [0, 2, 3]
    assert rec.aggregates["head"].calls == 4  # forwards 1..4 folded; 0 kept as the first failing
    assert rec.aggregates["head"].nonfinite_calls == 2


def test_inputs_are_kept_only_for_a_listener_that_asks():
    m = Net()
    nan = torch.full((1, 4), float("nan"))
    assert _run(m, [nan], level="modules").inputs_of(0) is None
    assert _run(m, [nan], level="modules", listener=KeepSteps(m)).inputs_of(0) is not None


def test_nan_or_posinf_data_fails_a_forward_and_a_neginf_mask_does_not():
    class Cleans(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0))

    for value, fails in ((float("nan"), True), (float("inf"), True), (float("-inf"), False), (1.0, False)):
        rec = _run(Cleans(), [torch.tensor([[value, 1.0]])], level="modules")
        assert (rec.first_failed == 0) is fails, value
        lin = next(c for c in rec.calls if c.module == "lin")
        assert rec.stats()[lin.outputs[0][1]].finite  # the module outputs are finite throughout


# --- parameters --------------------------------------------------------------------------------------


def test_parameters_are_measured_again_after_an_in_place_change():
    m = Net()
    rec = Recorder(m, level="modules", retain=4)
    x = torch.ones(1, 4)
    with rec, torch.no_grad():
        m(x)
        v0 = rec.weights_version()
        assert not rec.weights_changed_since(0)
        m.head.weight.mul_(10)
        assert rec.weights_version() > v0 and rec.weights_changed_since(0)
        m(x)
    rows = rec.stats()
    head0 = next(c for c in rec.calls_of(0) if c.module == "head")
    head1 = next(c for c in rec.calls_of(1) if c.module == "head")
    w0, w1 = dict(head0.params)["weight"], dict(head1.params)["weight"]
    assert w0 != w1
    assert rows[w1].absmax == pytest.approx(10 * rows[w0].absmax)
    assert rows[w1].absmax == pytest.approx(float(m.head.weight.detach().abs().max()))
    # an unchanged module's rows are shared by both calls
    lin0 = next(c for c in rec.calls_of(0) if c.module == "layers.0.0")
    lin1 = next(c for c in rec.calls_of(1) if c.module == "layers.0.0")
    assert lin0.params == lin1.params
    assert rec.param_row("head.weight", m.head.weight, 1) == w1
    assert rec.param_row("head.weight", m.head.weight, 0) is None  # step 0 used the old values
