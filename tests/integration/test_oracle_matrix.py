"""nanhunter held against an independent oracle (``tests/oracle``) across configurations.

Faults are planted in tiny real transformers models (Llama, Qwen2, GPT-2, T5; ``oracle.planted``)
and in a torchao float8 MLP; each configuration runs twice from the same weights and batches:
under the oracle's ``Tracer`` (which shares no code with nanhunter) and under nanhunter (the
Python ``watch`` API, or the real CLI where the configuration is a CLI one). Compared:

- names: role, phase, step, module, op, kind, token position, input index, ``grad_fn``, ``param``
  and the cause (where the oracle's classification is unambiguous);
- evidence: the numbers the report states: the op re-run in float64 and the operands' absmax
  (the watch's ``op_event`` and the diagnosis' evidence lines), the dtype limit judged against,
  divisor zero counts, the optimizer's counts, and the replay matrix's finite flags and absmax.

Axes: run precision (fp32, bf16, fp16, CPU autocast fp16/bf16 with the weight-cast cache on and
off) × fault (forward overflow, NaN norm weight, backward 0/0, Adam eps rounding to 0) × model ×
``on_fault`` (record, raise, skip, stop); ``generate()`` (watch, CLI, CLI ``--batch``) × model ×
precision; torchao ``convert_to_float8_training`` (tensorwise, rowwise) × eager/compiled. The full
cross product is marked ``matrix_full`` and runs with ``NANHUNTER_FULL_MATRIX=1`` (the compat
pass); the default slice covers every axis value at least once.

A known nanhunter bug is a ``known(...)`` mark: ``xfail(strict=True)`` on the disagreement's class
only (``EvidenceDisagreement``), so a names regression in the same configuration still fails.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import re
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("transformers")

from oracle import planted as P  # noqa: E402  (tests/ is on sys.path, as for tests/models)
from oracle.truth import Tracer, Truth  # noqa: E402

import nan_hunter  # noqa: E402

FULL = os.environ.get("NANHUNTER_FULL_MATRIX") == "1"
FAULT_STEP, STEPS = 1, 3
REPLAY = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
SHORT = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
LEAD, OTHER = "the quick fox", "hello world how are you"  # greedy decoding of LEAD makes the trigger


class EvidenceDisagreement(AssertionError):
    """A number the report states as evidence differs from the oracle's."""


def known(reason: str, names: bool = False):
    """A nanhunter bug found by the oracle: the evidence check (``names``: the names check too) is
    expected to fail, strictly."""
    return pytest.mark.xfail(
        strict=True, raises=AssertionError if names else EvidenceDisagreement, reason=reason
    )


def full_only(values: tuple, default: bool, *marks) -> pytest.param:
    if default:
        return pytest.param(*values, marks=list(marks))
    return pytest.param(
        *values,
        marks=[
            pytest.mark.matrix_full,
            *marks,
            pytest.mark.skipif(not FULL, reason="full matrix: NANHUNTER_FULL_MATRIX=1"),
        ],
    )


# --- precisions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    name: str
    params: torch.dtype  # what the model is stored in
    autocast: torch.dtype | None = None  # CPU autocast dtype, if any
    cache: bool = True  # autocast's weight-cast cache

    @property
    def compute(self) -> torch.dtype:
        return self.autocast or self.params

    def context(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=self.autocast, cache_enabled=self.cache)


PRECISIONS = {
    p.name: p
    for p in (
        Precision("fp32", torch.float32),
        Precision("bf16", torch.bfloat16),
        Precision("fp16", torch.float16),
        Precision("autocast-fp16-cache", torch.float32, torch.float16, True),
        Precision("autocast-fp16-nocache", torch.float32, torch.float16, False),
        Precision("autocast-bf16-cache", torch.float32, torch.bfloat16, True),
        Precision("autocast-bf16-nocache", torch.float32, torch.bfloat16, False),
    )
}
FAULTS = ("qk_overflow", "qk_overflow_neg", "autocast_cast", "nan_norm", "bwd_div0", "adam_eps")
POLICIES = ("record", "raise", "skip", "stop")


# --- comparison -------------------------------------------------------------------------------


def close(a: float | None, b: float | None, rtol: float) -> bool:
    if a is None or b is None:
        return a is b
    if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
        return str(a) == str(b)
    return abs(a - b) <= rtol * max(abs(a), abs(b)) + 1e-300


def get(obj, key):
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key)


def check_names(t: Truth, f, diagnosis, input_index: int | None) -> None:
    """Where: the fields a person acts on first."""
    assert f is not None, f"nanhunter found nothing; the oracle: {t}"
    want = {
        "role": t.role,
        "phase": t.phase,
        "step": t.step,
        "module": t.module,
        "kind": t.kind,
        "position": t.position,
    }
    if t.phase == "backward":
        want["grad_fn"] = t.grad_fn
    if t.phase == "optimizer":
        want["param"] = t.param
    if input_index is not None:
        want["input_index"] = input_index
    got = {k: get(f, k) for k in want}
    # an optimizer fault found without a capsule is explained from the state after the step, without
    # naming an op (contract v1.1): the op is compared only where nanhunter names one
    if t.phase != "optimizer" or get(f, "op") is not None:
        want["op"], got["op"] = t.op, get(f, "op")
    assert got == want, f"nanhunter {got} != oracle {want}"
    if t.cause is not None:
        assert diagnosis is not None and get(diagnosis, "cause") == t.cause, (
            f"cause {diagnosis and get(diagnosis, 'cause')} != oracle {t.cause}"
        )


NUM = r"([-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan|\?))"


def _num(s: str) -> float | None:
    return None if s == "?" else float(s)


def check_evidence(t: Truth, op_event, diagnosis, replay, rtol: float = 1e-3) -> list[str]:
    """The numbers the report states, against the oracle's; raises EvidenceDisagreement. Returns
    what was compared (so a test can insist that something was)."""
    done: list[str] = []
    bad: list[str] = []
    ev = t.event
    lines = list(get(diagnosis, "evidence") or []) if diagnosis is not None else []
    if ev is not None and t.phase != "optimizer":
        if op_event is not None:
            if ev.exact_absmax is not None and ev.exact_finite:  # a magnitude only where float64 holds it
                done.append("op_event.exact_absmax")
                if not close(op_event.exact_absmax, ev.exact_absmax, rtol):
                    bad.append(
                        f"op re-run in float64: absmax {op_event.exact_absmax} != oracle {ev.exact_absmax}"
                    )
            for o in op_event.operands:
                if o.dtype == "scalar" or o.absmax is None:
                    continue
                mine = [x for x in ev.operands if x.shape == list(o.shape)]
                done.append("op_event.operands")
                if not any(close(o.absmax, x.absmax, rtol) for x in mine):
                    bad.append(
                        f"operand #{o.index} {o.shape}: absmax {o.absmax} != oracle "
                        f"{[x.absmax for x in mine]}"
                    )
        for line in lines:
            m = re.search(rf"absmax {NUM} > (\w+) max {NUM}", line)
            if m and ev.exact_absmax is not None and ev.exact_finite:
                done.append("evidence: absmax > max")
                x, name, lim = _num(m[1]), m[2], _num(m[3])
                want_name = SHORT.get(ev.out_dtype, ev.out_dtype)
                if not close(x, ev.exact_absmax, rtol):
                    bad.append(f"evidence {line!r}: absmax {x} != oracle {ev.exact_absmax:.6g}")
                if name != want_name or not close(lim, torch.finfo(getattr(torch, ev.out_dtype)).max, rtol):
                    bad.append(f"evidence {line!r}: limit {name} {lim} != the op's output dtype {want_name}")
            for m in re.finditer(rf"#(\d+) (\w+)\[([\d, ]*)\] absmax {NUM}", line):
                shape = [int(s) for s in m[3].split(",") if s.strip()]
                mine = [x for x in ev.operands if x.shape == shape]
                done.append("evidence: operand absmax")
                if not any(close(_num(m[4]), x.absmax, rtol) for x in mine):
                    bad.append(
                        f"evidence operand #{m[1]} {shape}: absmax {m[4]} != oracle {[x.absmax for x in mine]}"
                    )
            m = re.search(r"divisor has (\d+) zero\(s\) of (\d+)", line)
            if m:
                done.append("evidence: divisor zeros")
                div = [x for x in ev.operands if x.numel == int(m[2])]
                if not any(x.zeros == int(m[1]) for x in div):
                    bad.append(
                        f"evidence {line!r}: oracle divisor zeros {[(x.zeros, x.numel) for x in ev.operands]}"
                    )
    if t.optimizer_facts is not None:
        pf = t.optimizer_facts
        for line in lines:
            m = re.search(r"holds (\d+) non-finite value\(s\) of (\d+) after it", line)
            if m:
                done.append("evidence: optimizer non-finite count")
                if (int(m[1]), int(m[2])) != (pf["n_bad"], pf["numel"]):
                    bad.append(f"evidence {line!r}: oracle {pf['n_bad']} of {pf['numel']}")
            m = re.search(
                r"state (\w+) \((\w+)\): (\d+) zero\(s\) where the parameter went non-finite, (\d+) in all",
                line,
            )
            if m:
                done.append("evidence: optimizer state zeros")
                st = pf["state"].get(m[1])
                if st is None or (int(m[3]), int(m[4])) != (st["zeros_bad"], st["zeros"]):
                    bad.append(f"evidence {line!r}: oracle {st}")
            m = re.search(
                rf"gradient: (\d+) zero\(s\) where the parameter went non-finite, absmax {NUM}", line
            )
            if m:
                done.append("evidence: optimizer gradient")
                if int(m[1]) != pf.get("grad_zeros_bad") or not close(
                    _num(m[2]), pf.get("grad_absmax"), rtol
                ):
                    bad.append(
                        f"evidence {line!r}: oracle {pf.get('grad_zeros_bad')} zeros, absmax "
                        f"{pf.get('grad_absmax')}"
                    )
    if t.replay and replay:
        for dt, mine in t.replay.items():
            theirs = replay.get(SHORT[dt])
            if theirs is None or "error" in mine or theirs.get("error"):
                continue
            done.append(f"replay {SHORT[dt]}")
            if theirs["finite"] != mine["finite"] or not close(theirs["absmax"], mine["absmax"], rtol):
                bad.append(
                    f"replay {SHORT[dt]}: finite {theirs['finite']} absmax {theirs['absmax']} != oracle "
                    f"{mine['finite']} {mine['absmax']}"
                )
    if bad:
        raise EvidenceDisagreement("; ".join(bad))
    return done


# --- training ---------------------------------------------------------------------------------


def build_training(family: str, fault: str, prec: Precision):
    model = P.build(family)
    if fault == "bwd_div0":
        P.install_sqrt_gate(model)
    model = model.to(prec.params)
    data = P.batches(family, STEPS, FAULT_STEP, trigger=fault.startswith("qk_") or fault == "autocast_cast")
    return model, data


def make_opt(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-4)


def train(model, opt, data, fault: str, prec: Precision, watch=None) -> list[float]:
    """The user's loop. Every fault is planted at the start of step FAULT_STEP (a trigger word in
    that step's batch, or weights and hyperparameters changed in place before its forward)."""
    losses = []
    for step, batch in enumerate(data):
        if step == FAULT_STEP:
            if fault == "qk_overflow":
                P.plant_qk_overflow(model, prec.compute)
            elif fault == "qk_overflow_neg":
                P.plant_qk_overflow(model, prec.compute, sign=-1.0)
            elif fault == "autocast_cast":
                P.plant_qk_overflow(model, prec.compute, value=1e6)
            elif fault == "nan_norm":
                P.plant_nan_norm(model)
            elif fault == "bwd_div0":
                P.plant_bwd_div0(model)
            elif fault == "adam_eps":
                P.plant_adam_eps(opt, prec.params)
        with prec.context():
            loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if watch is not None and watch.should_stop:
            break
    return losses


@functools.cache
def training_truth(family: str, fault: str, precision: str) -> Truth:
    prec = PRECISIONS[precision]
    model, data = build_training(family, fault, prec)
    opt = make_opt(model)
    with Tracer(model, opt) as tr:
        train(model, opt, data, fault, prec)
    t = tr.truth(replay_dtypes=REPLAY)
    assert t is not None, "the planted fault never fired"
    return t


def training_report(family: str, fault: str, precision: str, policy: str):
    prec = PRECISIONS[precision]
    model, data = build_training(family, fault, prec)
    opt = make_opt(model)
    w = nan_hunter.watch(model, backward=True, optimizer=opt, on_fault=policy)
    if policy == "raise":
        with pytest.raises(nan_hunter.NonFiniteError) as err, w:
            train(model, opt, data, fault, prec, watch=w)
        return err.value.report, w
    with w:
        train(model, opt, data, fault, prec, watch=w)
    return w.report(), w


def applies(fault: str, precision: str) -> bool:
    """``autocast_cast`` needs fp16 autocast: fp32 weights whose fp16 copy overflows."""
    return fault != "autocast_cast" or PRECISIONS[precision].autocast == torch.float16


# The default slice: every value of every axis at least once (test_default_slices_cover_every_axis_value)
DEFAULT_TRAINING = {
    ("llama", "qk_overflow", "fp32", "record"),
    ("qwen2", "nan_norm", "bf16", "raise"),
    ("gpt2", "bwd_div0", "fp16", "stop"),
    ("t5", "qk_overflow", "autocast-fp16-cache", "record"),
    ("llama", "autocast_cast", "autocast-fp16-nocache", "skip"),
    ("gpt2", "qk_overflow_neg", "autocast-bf16-cache", "raise"),
    ("qwen2", "qk_overflow", "autocast-bf16-nocache", "stop"),
    ("llama", "adam_eps", "fp16", "skip"),
}
TRAINING_CASES = [
    full_only((fam, fault, prec, pol), (fam, fault, prec, pol) in DEFAULT_TRAINING)
    for fam in P.FAMILIES
    for fault in FAULTS
    for prec in PRECISIONS
    for pol in POLICIES
    if applies(fault, prec)
]


@pytest.mark.slow
@pytest.mark.parametrize("family,fault,precision,policy", TRAINING_CASES)
def test_training(family, fault, precision, policy):
    truth = training_truth(family, fault, precision)
    rep, w = training_report(family, fault, precision, policy)
    check_names(truth, rep.first_nonfinite, rep.diagnosis, input_index=truth.step)
    if policy == "skip":
        assert truth.step in (rep.run["skipped_steps"] or []), rep.run["skipped_steps"]
    if policy == "stop":
        assert w.should_stop
    done = check_evidence(truth, rep.op_event, rep.diagnosis, rep.replay)
    if fault != "nan_norm":  # a NaN weight has no magnitude to state
        assert done, "no evidence number was compared"


def test_default_slices_cover_every_axis_value():
    for axis, values in enumerate((P.FAMILIES, FAULTS, tuple(PRECISIONS), POLICIES)):
        assert {c[axis] for c in DEFAULT_TRAINING} == set(values)
    assert all(applies(c[1], c[2]) for c in DEFAULT_TRAINING)
    for axis, values in enumerate((("llama", "qwen2", "gpt2"), GEN_PRECISIONS, GENERATE_MODES)):
        assert {c[axis] for c in DEFAULT_GENERATE} == set(values)


# --- generate() -------------------------------------------------------------------------------


def build_generate(family: str, compute: torch.dtype):
    model = P.build(family).eval()
    P.plant_qk_overflow(model, compute)
    P.plant_lead_to_trigger(model, P.token_ids(LEAD, family), P.token_ids(OTHER, family))
    return model


def _generate(model, enc):
    with torch.no_grad():
        return model.generate(**enc, max_new_tokens=2, do_sample=False, pad_token_id=P.PAD)


@functools.cache
def generate_truth(family: str, precision: str, batch: bool, prompts: tuple[str, ...]) -> tuple[int, Truth]:
    """(the failing input's data-set index, the oracle's truth) for the prompts decoded one by one
    (the first input that fails) or as one left-padded batch (the failing row)."""
    prec = PRECISIONS[precision]
    base = build_generate(family, prec.compute).to(prec.params)
    for i, enc in enumerate(P.tokenize(list(prompts), batch, family)):
        m = copy.deepcopy(base)
        with Tracer(m) as tr, prec.context():
            _generate(m, enc)
        t = tr.truth(replay_dtypes=REPLAY)
        if t is not None:
            return (t.row if batch else i), t
    raise AssertionError("the planted fault never fired")


GENERATE_MODES = ("watch", "watch-batch", "cli", "cli-batch")
GEN_PRECISIONS = ("fp32", "bf16", "fp16", "autocast-fp16-cache")
DEFAULT_GENERATE = {
    ("llama", "fp16", "cli-batch"),
    ("qwen2", "bf16", "watch"),
    ("gpt2", "fp32", "cli"),
    ("llama", "autocast-fp16-cache", "watch-batch"),
}
GENERATE_CASES = [
    full_only((fam, prec, mode), (fam, prec, mode) in DEFAULT_GENERATE)
    for fam in ("llama", "qwen2", "gpt2")
    for prec in GEN_PRECISIONS
    for mode in GENERATE_MODES
    if not (mode.startswith("cli") and PRECISIONS[prec].autocast)
]  # the CLI has no autocast flag


@pytest.mark.slow
@pytest.mark.parametrize("family,precision,mode", GENERATE_CASES)
def test_generate(family, precision, mode, cli_main, tmp_path):
    prec = PRECISIONS[precision]
    batch = mode.endswith("batch")
    # the failing prompt second in one order, first in the other, so the index is not a default
    prompts = (OTHER, LEAD) if family != "qwen2" else (LEAD, OTHER)
    index, truth = generate_truth(family, precision, batch, prompts)
    assert (truth.step, truth.token_id) == (1, P.TRIGGER)  # the plant: decode step 1 reads the trigger
    if mode.startswith("watch"):
        base = build_generate(family, prec.compute).to(prec.params)
        encs = P.tokenize(list(prompts), batch, family)
        enc = encs[0] if batch else encs[index]
        with nan_hunter.watch(base) as w, prec.context():
            _generate(base, enc)
        rep = w.report()
        f, diag, replay, op_event = rep.first_nonfinite, rep.diagnosis, rep.replay, rep.op_event
        want_index = truth.step  # under watch, inputs are the root calls
    else:
        model = build_generate(family, prec.compute)
        d = P.save_hf_dir(model, tmp_path / "model")
        args = ["scan", d, "--generate", "2", "--dtype", SHORT[str(prec.params)[6:]], "--attn", "eager"]
        for p in prompts:
            args += ["--prompt", p]
        res = cli_main(*args, *(["--batch"] if batch else []))
        assert res.code == 1, res.stderr
        r = res.report
        f, diag, replay, op_event = r["first_nonfinite"], r["diagnosis"], r["replay"], None
        want_index = index
        g = r["run"]["generate"]
        assert g["first_bad_step"] == truth.step
        if g.get("fault_token") is not None:
            assert g["fault_token"]["id"] == truth.token_id
    check_names(truth, f, diag, input_index=want_index)
    assert check_evidence(truth, op_event, diag, replay)


# --- torchao float8 training ------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 128, bias=False)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(128, 64, bias=False)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class Float8Net(torch.nn.Module):
    """Linear dims multiples of 16, as float8 training needs."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(32, 64, bias=False)
        self.block = MLP()
        self.head = torch.nn.Linear(64, 16, bias=False)

    def forward(self, x):
        x = self.inp(x)
        x = x + self.block(x)
        return self.head(x)


def build_float8(recipe: str):
    """(model, batches, factor): a bf16 net converted with convert_to_float8_training; scaling
    ``block.down``'s weight by ``factor`` (computed in float64, finite in bf16) makes its matmul's
    exact result twice bf16's max on the batch of step FAULT_STEP."""
    ao = pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    model = Float8Net().to(torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    data = [torch.randn(32, 32, generator=g).to(torch.bfloat16) for _ in range(STEPS)]
    seen = {}
    h = model.block.down.register_forward_hook(lambda m, a, o: seen.update(x=a[0].detach()))
    with torch.no_grad():
        model(data[FAULT_STEP])
    h.remove()
    w = model.block.down.weight.detach().double()
    factor = 2 * torch.finfo(torch.bfloat16).max / float((seen["x"].double() @ w.T).abs().max())
    assert factor * float(w.abs().max()) < torch.finfo(torch.bfloat16).max
    ao.convert_to_float8_training(model, config=ao.Float8LinearConfig.from_recipe_name(recipe))
    return model, data, factor


def train_float8(model, run, opt, data, factor) -> list[float]:
    losses = []
    for step, x in enumerate(data):
        if step == FAULT_STEP:
            with torch.no_grad():
                w = model.block.down.weight
                w.copy_((w.double() * factor).to(w.dtype))
        loss = run(x).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@functools.cache
def float8_truth(recipe: str) -> Truth:
    model, data, factor = build_float8(recipe)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with Tracer(model, opt) as tr:
        train_float8(model, model, opt, data, factor)
    t = tr.truth(replay_dtypes=(torch.float32, torch.bfloat16))
    assert t is not None
    return t


COMPILED_ROWWISE = (
    "a watch on torch.compile'd rowwise float8 training: report() re-runs forward 1 eagerly "
    "from its captured inputs and that re-run does not reproduce the non-finite value, so the "
    "location falls back to the compiled root ('', nan) where the oracle sees block.down's "
    "aten.mm (posinf)"
)


FLOAT8_CASES = [
    full_only(
        (recipe, compiled),
        (recipe, compiled) in {("tensorwise", False), ("rowwise", True)},
        *([known(COMPILED_ROWWISE, names=True)] if (recipe, compiled) == ("rowwise", True) else []),
    )
    for recipe in ("tensorwise", "rowwise")
    for compiled in (False, True)
]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,compiled", FLOAT8_CASES)
def test_float8_training(recipe, compiled):
    """Real torchao float8 training on the CPU, eager and under torch.compile (inductor). The oracle
    traces the eager run (a compiled region has no aten ops to see): the contract names a compiled
    fault by its eager module and op. Compiled numerics differ a little, so numbers get 5%."""
    truth = float8_truth(recipe)
    model, data, factor = build_float8(recipe)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = torch.compile(model) if compiled else model
    with nan_hunter.watch(run, backward=True, optimizer=opt) as w:
        losses = train_float8(model, run, opt, data, factor)
    assert all(math.isfinite(x) for x in losses[:FAULT_STEP]) and not math.isfinite(losses[FAULT_STEP])
    rep = w.report()
    check_names(truth, rep.first_nonfinite, rep.diagnosis, input_index=truth.step)
    assert check_evidence(truth, rep.op_event, rep.diagnosis, rep.replay, rtol=5e-2 if compiled else 1e-3)
