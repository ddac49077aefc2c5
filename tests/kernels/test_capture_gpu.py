"""Capture on a real GPU: hooked forwards never synchronise the host, the report reads the rows
back in one transfer, and capture works inside CUDA-graph capture (rows rewritten per replay)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("triton")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

import nan_hunter  # noqa: E402
from nan_hunter.capture import sink as sink_mod  # noqa: E402

CUDA = "cuda"


class Layer(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        # inputs ~1000x too large overflow fp16 in the square: a producer op inside ``layers.0``
        return x + self.down(torch.square(self.up(x)) * 0.1)


class Tower(nn.Module):
    def __init__(self, d: int = 64, n: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(Layer(d) for _ in range(n))
        self.head = nn.Linear(d, 16)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture
def tower():
    torch.manual_seed(0)
    return Tower().to(CUDA, torch.float16).eval()


def _x(scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(8, 64, generator=g) * scale).to(CUDA, torch.float16)


def _where(report):
    f = report.first_nonfinite
    return None if f is None else (f.module, f.op, f.kind, f.role)


def _syncs(fn) -> int:
    """Host synchronisations ``fn`` performs, as counted by torch's sync debug mode."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)


def test_backend_is_triton_on_cuda(tower):
    with nan_hunter.watch(tower, level="modules") as w:
        assert w.sink.backend == "triton"


@pytest.mark.parametrize("level", ["blocks", "modules"])
def test_hooked_forward_never_synchronises(tower, level):
    """The issue's proof: sync debug mode "error" around a hooked forward (warm, so that kernel
    compilation is not what is measured) raises on any synchronising call."""
    x = _x(1000.0)
    with torch.no_grad():
        with nan_hunter.watch(tower, level=level):
            tower(x)  # warm-up: compile and load the kernels
        w = nan_hunter.watch(tower, level=level)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with w:
                out = tower(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert not torch.isfinite(out).all()
        with nan_hunter.watch(tower, level="modules", backend="reference") as ref:
            tower(x)
    assert _where(w.report()) == _where(ref.report())
    assert _where(w.report())[0] == "layers.0"


def test_outputs_bitwise_equal_under_watch(tower):
    x = _x()
    with torch.no_grad():
        plain = tower(x)
        for level in ("blocks", "modules", "ops"):
            with nan_hunter.watch(tower, level=level):
                assert torch.equal(tower(x), plain), level


def test_report_reads_rows_back_in_one_transfer(tower, monkeypatch):
    monkeypatch.setattr(sink_mod, "CHUNK", 8)  # several segments
    with torch.no_grad(), nan_hunter.watch(tower, level="modules") as w:
        for _ in range(3):
            tower(_x())
    assert len(w.sink._segments) > 1
    assert _syncs(w.sink.rows) == 1


def test_llama_forward_gains_no_syncs_from_watch():
    """A real transformers Llama (built from a config) syncs on its own in some versions; watch
    must add none at blocks or modules level."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(CUDA, torch.bfloat16).eval()
    ids = torch.randint(0, 512, (2, 64), device=CUDA)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        base = _syncs(lambda: model(input_ids=ids))
        for level in ("blocks", "modules"):
            with nan_hunter.watch(model, level=level):
                model(input_ids=ids)  # warm-up
            w = nan_hunter.watch(model, level=level)
            got = {}

            def hooked(w=w, got=got):
                with w:
                    got["logits"] = model(input_ids=ids).logits

            assert _syncs(hooked) == base, level
            assert torch.equal(got["logits"], plain)
            assert w.report().first_nonfinite is None


def _capture(model: nn.Module, static_x: torch.Tensor) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(static_x)
    return graph


@pytest.mark.parametrize("level", ["modules", "blocks"])
def test_capture_inside_cuda_graph(tower, level):
    """Hooks run while the graph is captured; each replay rewrites the rows, and report() then
    says what that replay computed, the same place an eager capture names."""
    static_x = _x()
    with torch.no_grad():
        w = nan_hunter.watch(tower, level=level)
        with w:
            graph = _capture(tower, static_x)
        assert w.sink.graph_rows
        graph.replay()
        assert w.report().first_nonfinite is None
        static_x.copy_(_x(1000.0))
        graph.replay()
        got = _where(w.report())
        with nan_hunter.watch(tower, level="modules") as eager:
            tower(_x(1000.0))
        assert got == _where(eager.report()) and got[0] == "layers.0"
        static_x.copy_(_x())
        graph.replay()
        assert w.report().first_nonfinite is None  # rows follow the latest replay


def test_ops_level_refuses_graph_capture(tower):
    static_x = _x()
    with torch.no_grad(), nan_hunter.watch(tower, level="ops"):
        with pytest.raises(RuntimeError) as e:
            _capture(tower, static_x)
    chain = [e.value, e.value.__context__, e.value.__cause__]
    assert any(c is not None and "CUDA-graph capture" in str(c) for c in chain)


def test_graph_outlives_its_watch(tower):
    """Rows written by a captured graph live in process-wide graph segments: replaying after the
    watch is gone (and its memory released) neither crashes nor corrupts other memory."""
    import gc

    static_x = _x()
    with torch.no_grad():
        w = nan_hunter.watch(tower, level="modules")
        with w:
            graph = _capture(tower, static_x)
        segments = [s for s in w.sink._segments if s.graph]
        assert segments and all(s in sink_mod._GRAPH_SEGMENTS for s in segments)
        del w
        gc.collect()
        torch.cuda.empty_cache()
        filler = torch.full((1 << 22,), 7.0, device=CUDA)  # reuse whatever memory was released
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert (filler == 7.0).all()
        want = tower(static_x)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.isfinite(want).all()


# host synchronisations a healthy step may add: record and skip none (skip decides on the device with
# torch.where; AdamW's host-side step counts are restored from a flag read without a sync); raise and
# stop read one flag before the update (a fault is explained with the weights it ran with, and stop
# leaves the update unapplied) and one after it (the optimizer's own phase)
_STEP_SYNCS = {"record": 0, "skip": 0, "raise": 2, "stop": 2}


@pytest.mark.parametrize("policy", sorted(_STEP_SYNCS))
def test_training_step_reads_back_at_most_once(policy):
    """A healthy training step (forward, backward, AdamW) under watch(backward=True, optimizer=opt,
    on_fault=policy) adds at most ``_STEP_SYNCS[policy]`` host synchronisations to the plain step's.
    The first GPU run found 18 per step for skip (a flag read per AdamW state tensor)."""
    torch.manual_seed(0)
    model = Tower().to(CUDA).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = _x().float()

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()  # AdamW's state exists, kernels are compiled
    base = _syncs(step)
    with nan_hunter.watch(model, level="blocks", backward=True, optimizer=opt, on_fault=policy) as w:
        for _ in range(2):
            step()
        watched = [_syncs(step) for _ in range(3)]
    assert w.report().first_nonfinite is None
    assert max(watched) - base <= _STEP_SYNCS[policy], (policy, base, watched)


def test_skip_on_cuda_is_bitwise():
    """on_fault="skip" on the GPU: the faulty step leaves parameters and AdamW state bitwise as a
    run that never took that step."""

    def run(watched: bool, leave_out: int | None):
        torch.manual_seed(0)
        model = Tower().to(CUDA).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        w = (
            nan_hunter.watch(model, level="blocks", backward=True, optimizer=opt, on_fault="skip")
            if watched
            else None
        )
        if w is not None:
            w.__enter__()
        try:
            for s in range(5):
                if s == leave_out:
                    continue
                g = torch.Generator().manual_seed(s)
                x = (torch.randn(8, 64, generator=g) * (1e20 if s == 2 else 1.0)).to(
                    CUDA
                )  # step 2: square > fp32 max
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            rep = w.report() if w is not None else None
        finally:
            if w is not None:
                w.__exit__(None, None, None)
        return model, opt, rep

    m, opt, rep = run(True, None)
    m2, opt2, _ = run(False, 2)
    assert rep.run["skipped_steps"] == [2]
    for (k, a), b in zip(m.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(a, b), k
    for sa, sb in zip(opt.state_dict()["state"].values(), opt2.state_dict()["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_stop_on_cuda_leaves_the_last_good_state():
    """on_fault="stop" with optimizer= on the GPU (contract v1.3): the failing step's update is undone
    as skip undoes it (torch.where on the device, AdamW's host-side step counts through ``_settle``),
    so after stopping, parameters and AdamW state are bitwise a run of the steps before it."""

    def run(watched: bool, steps: int):
        torch.manual_seed(0)
        model = Tower().to(CUDA).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        w = (
            nan_hunter.watch(model, level="blocks", backward=True, optimizer=opt, on_fault="stop")
            if watched
            else None
        )
        ran = 0
        with w if w is not None else warnings.catch_warnings():
            for s in range(steps):
                g = torch.Generator().manual_seed(s)
                x = (torch.randn(8, 64, generator=g) * (1e20 if s == 2 else 1.0)).to(
                    CUDA
                )  # step 2: square > fp32 max
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                ran += 1
                if w is not None and w.should_stop:
                    break
            rep = w.report() if w is not None else None
        return model, opt, rep, ran

    m, opt, rep, ran = run(True, 5)
    m2, opt2, _, _ = run(False, 2)
    assert ran == 3 and rep.run["skipped_steps"] == [2]
    for (k, a), b in zip(m.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(a, b), k
    for sa, sb in zip(opt.state_dict()["state"].values(), opt2.state_dict()["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
