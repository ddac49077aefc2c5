"""watch() in long loops and generate(): bounded memory, the first failing forward kept in full,
a report() that changes nothing of the user's and re-runs under the forward's own context."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import nan_hunter


class Net(nn.Module):
    """Three residual blocks of Linear + GELU; all-ones weights, so an input of ones · s gives
    4 · s at the first Linear: s = 2e4 overflows fp16 (80000 > 65504) there, s = 1 is clean."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(4, 2)
        with torch.no_grad():
            for p in self.parameters():
                p.fill_(1.0 if p.dim() == 2 else 0.0)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x) * 1e-3
        return self.head(x)


def _batch(s: float) -> torch.Tensor:
    return torch.full((2, 4), s, dtype=torch.float16)


def test_rows_and_calls_stay_bounded_over_many_forwards():
    """Clean forwards are folded into per-module aggregates and their rows reused: after warm-up
    neither the kept calls nor the sink's rows grow (before: one Call per module call and one
    row per tensor, forever). bench/watch_memory.py runs 100,000 forwards and prints RSS."""
    model = Net().eval()
    x = _batch(1.0).float()
    with torch.no_grad(), nan_hunter.watch(model, level="modules") as w:
        for _ in range(50):
            model(x)
        rows_after_warmup = w.sink.n
        for _ in range(250):
            model(x)
    per_forward = sum(1 for _ in model.modules())
    assert len(w.calls) <= 5 * per_forward  # retain=4 latest forwards (+ a failing one: none here)
    assert w.sink.n == rows_after_warmup
    assert w.sink.rows_in_use <= 5 * 3 * per_forward + 16  # inputs, outputs, params
    r = w.report()
    agg = {a["module"]: a for a in r.aggregates}
    assert agg["layers.0.0"]["calls"] == 300 - 4 and agg["layers.0.0"]["absmax"] == pytest.approx(4.0)
    assert r.first_nonfinite is None and r.failed_inputs == [] and r.n_forwards == 300


def test_first_failing_forward_kept_after_ten_batches():
    """Batch 2 of 10 fails: with the default level and retain=4, report() still re-runs it and
    names the leaf module and the aten op (before: its inputs were evicted, a block and no op)."""
    model = Net().half().eval()
    with torch.no_grad(), nan_hunter.watch(model) as w:
        for i in range(10):
            model(_batch(2e4 if i == 2 else 1.0))
    r = w.report()
    f = r.first_nonfinite
    assert (f.input_index, f.module, f.role, f.kind) == (2, "layers.0.0", "producer", "posinf")
    assert f.op in ("aten.addmm.default", "aten.mm.default")
    assert f.source is not None and f.source.startswith(__file__)  # Net.forward, not torch's linear.py
    assert r.failed_inputs == [2]


def test_inputs_of_the_first_failing_forward_survive_in_place_reuse():
    """A loop that refills one input buffer in place (as pinned-memory loaders do): the failing
    forward's inputs were copied when it was judged, so the report still reproduces it."""
    model = Net().half().eval()
    buf = _batch(1.0)
    with torch.no_grad(), nan_hunter.watch(model, level="modules") as w:
        for i in range(8):
            buf.fill_(2e4 if i == 1 else 1.0)
            model(buf)
    r = w.report()
    assert r.first_nonfinite.input_index == 1 and r.first_nonfinite.op is not None
    assert not any("did not reproduce" in n for n in r.notes)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(cfg).half().eval()
    with torch.no_grad():
        # every hidden state is ~1, so gate = up = 1.6 and down_proj gives 1000 · 64 · 2.1 > 65504
        model.model.embed_tokens.weight.fill_(1.0)
        mlp = model.model.layers[0].mlp
        mlp.gate_proj.weight.fill_(0.05)
        mlp.up_proj.weight.fill_(0.05)
        mlp.down_proj.weight.fill_(1000.0)
    return model


def _cached_keys(cache):
    """Each layer's keys: ``cache.layers[i].keys`` (transformers >= 4.56), ``cache.key_cache[i]`` before."""
    layers = getattr(cache, "layers", None)
    return [layer.keys for layer in layers] if layers is not None else list(cache.key_cache)


def test_report_after_generate_names_leaf_and_op_and_leaves_the_cache_alone():
    model = _tiny_llama()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with nan_hunter.watch(model) as w:
        out = model.generate(
            ids, max_new_tokens=12, do_sample=False, return_dict_in_generate=True, pad_token_id=0
        )
    cache = out.past_key_values
    length = cache.get_seq_length()
    keys = [k.clone() for k in _cached_keys(cache)]
    rng = torch.get_rng_state()
    r = w.report()
    assert cache.get_seq_length() == length
    assert all(
        torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) for a, b in zip(keys, _cached_keys(cache))
    )
    assert torch.equal(rng, torch.get_rng_state())
    f = r.first_nonfinite
    assert (f.input_index, f.module, f.role) == (0, "model.layers.0.mlp.down_proj", "producer")
    assert f.op == "aten.mm.default"
    assert "modeling_llama.py" in f.source  # the model's own line, not torch/nn/modules/linear.py
    assert r.failed_inputs == list(range(12))


class Trained(nn.Module):
    """Dropout and BatchNorm in train mode: a re-run would draw random numbers and update the
    running statistics unless report() protects them."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)
        self.norm = nn.BatchNorm1d(4)
        self.out = nn.Linear(4, 2)
        with torch.no_grad():
            self.out.weight.fill_(3e38)  # |norm output| ~1: sums past the fp32 max

    def forward(self, x):
        return self.out(self.norm(self.drop(self.inp(x))))


def test_report_changes_no_rng_parameter_or_buffer_and_reproduces_dropout():
    torch.manual_seed(0)
    model = Trained().train()
    with nan_hunter.watch(model, level="modules") as w:
        model(torch.randn(8, 4)).sum()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    r = w.report()
    assert torch.equal(rng, torch.get_rng_state())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert model.training and model.norm.training
    f = r.first_nonfinite
    assert f.module == "out" and f.op in ("aten.addmm.default", "aten.mm.default")
    assert not any("did not reproduce" in n for n in r.notes)


def test_report_outside_cpu_bf16_autocast_reproduces():
    """1.7e38 + 1.7e38 = 3.4e38 is finite in fp32 but past bf16's max: the Linear overflows
    only under autocast, so a re-run without it would not reproduce."""
    model = nn.Sequential(nn.Linear(2, 1, bias=False), nn.ReLU())
    with torch.no_grad():
        model[0].weight.fill_(1.7e38)
    x = torch.ones(1, 2)
    assert torch.isfinite(model(x)).all()
    with torch.autocast("cpu", dtype=torch.bfloat16), nan_hunter.watch(model) as w:
        assert not torch.isfinite(model(x)).all()
    r = w.report()
    f = r.first_nonfinite
    assert (f.module, f.kind) == ("0", "posinf") and f.op in ("aten.mm.default", "aten.addmm.default")
    assert not any("did not reproduce" in n for n in r.notes)


def test_report_outside_inference_mode_reproduces():
    model = Net().half().eval()
    with torch.inference_mode(), nan_hunter.watch(model, level="blocks") as w:
        model(_batch(1.0))
        model(_batch(2e4))
    f = w.report().first_nonfinite
    assert (f.input_index, f.module) == (1, "layers.0.0") and f.op is not None


_NO_WARNING = """
import torch
from torch import nn
import nan_hunter

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
with nan_hunter.watch(model, level={level!r}) as w:
    model(torch.randn(3, 4)).sum().backward()
    with torch.no_grad():
        model[2].weight[0, 0] = float("inf")
    model(torch.randn(3, 4)).sum()
f = w.report().first_nonfinite
assert (f.module, f.role) == ("2", "weights"), f
"""


@pytest.mark.parametrize("level", ["blocks", "modules", "ops"])
def test_statistics_raise_no_warning_under_grad(level):
    """Forward and backward with grad on, in a fresh process (torch warns once per process):
    no UserWarning from turning a requires_grad statistic into a Python number (before:
    kernels/reference.py warned at level blocks)."""
    proc = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", _NO_WARNING.format(level=level)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_device_rows_are_folded_and_reused_under_triton(monkeypatch):
    """The device-row sink (Triton backend; under TRITON_INTERPRET=1 on a CPU): forwards are folded
    in batches with one read-back, freed rows are reset to the kernel's starting row before they
    are reused, and the numbers agree with the torch reference's."""
    pytest.importorskip("triton")

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py) or a GPU")
    from nan_hunter.capture import recorder

    monkeypatch.setattr(recorder, "FOLD_BATCH", 4)  # fold every 4 forwards: four folds in 18 forwards
    dev = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"  # where the kernels can read
    model = Net().eval().to(dev)
    got, sizes = {}, {}
    for backend in ("triton", "reference"):
        with (
            torch.no_grad(),
            nan_hunter.watch(model, level="blocks", retain=2, backend=backend, device=dev) as w,
        ):
            for i in range(18):
                model(torch.full((2, 4), 3e38 if i == 5 else float(i % 7 + 1), device=dev))
                if i == 13:
                    sizes[backend] = w.sink.n
        assert w.sink.n == sizes[backend]  # rows of folded forwards were reused, not appended
        r = got[backend] = w.report()
        f = r.first_nonfinite
        assert (f.input_index, f.module) == (5, "layers.0.0") and f.op in (
            "aten.addmm.default",
            "aten.mm.default",
        )
        assert r.failed_inputs == [5]
    agg = {
        b: {a["module"]: (a["calls"], a["absmax"], a["nonfinite_calls"]) for a in got[b].aggregates}
        for b in got
    }
    assert agg["triton"].keys() == agg["reference"].keys() and len(agg["triton"]) == 4
    for k, (calls, absmax, bad) in agg["reference"].items():
        assert agg["triton"][k][0] == calls and agg["triton"][k][2] == bad
        assert agg["triton"][k][1] == pytest.approx(absmax, rel=1e-6)


def test_device_flags_keep_the_first_failing_inputs_when_the_device_lags(monkeypatch):
    """On a CUDA sink a forward is judged from a flag the device computes and copies back without a
    synchronisation; here (Triton interpreted on a CPU) the flag's event is simulated to complete
    only two forwards later, longer than retain=2 keeps inputs: the watch waits for that flag
    before dropping the inputs, so the failing forward's inputs survive and report() names the op."""
    pytest.importorskip("triton")

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("simulates a lagging CUDA device with the interpreted kernels")
    from nan_hunter.capture import recorder

    class LaggingEvent:
        recorded = 0

        def record(self):
            LaggingEvent.recorded += 1
            self.at = LaggingEvent.recorded

        def query(self):
            return LaggingEvent.recorded - self.at >= 2

        def synchronize(self):
            pass

    monkeypatch.setattr(torch.cuda, "Event", LaggingEvent)
    monkeypatch.setattr(recorder.Recorder, "_rows_on_host", lambda self: False)
    monkeypatch.setattr(recorder, "FOLD_BATCH", 4)
    model = Net().eval()
    with (
        torch.no_grad(),
        nan_hunter.watch(model, level="blocks", retain=2, backend="triton", device="cpu") as w,
    ):
        for i in range(12):
            model(torch.full((2, 4), 3e38 if i == 5 else 1.0))
            assert len(w.retained) <= 3  # the latest two, and the flagged one
    r = w.report()
    f = r.first_nonfinite
    assert (f.input_index, f.module) == (5, "layers.0.0") and f.op in (
        "aten.addmm.default",
        "aten.mm.default",
    )
    assert not any("not kept" in n for n in r.notes)


def test_watch_memory_bench_runs(tmp_path):
    """bench/watch_memory.py end to end on a few hundred forwards: flat rows, the failing forward
    found with its op."""
    import json
    from pathlib import Path

    out = tmp_path / "m.json"
    bench = Path(__file__).resolve().parents[2] / "bench" / "watch_memory.py"
    proc = subprocess.run(
        [
            sys.executable,
            str(bench),
            "--forwards",
            "300",
            "--every",
            "100",
            "--fail-at",
            "20",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert [s["forwards"] for s in res["samples"]] == [0, 100, 200, 300]
    assert res["samples"][1]["row_capacity"] == res["samples"][-1]["row_capacity"]
    assert res["report"]["input_index"] == 20 and res["report"]["op"] == "aten.addmm.default"
