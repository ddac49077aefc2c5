"""A watched forward's fixed cost (issue 36): CPU time per forward with and without ``nan_hunter.watch``.

The shipped tiny Llama (``examples/tiny-llama-fp16`` in fp32: hidden 64, 2 layers), batch
``--batch`` x ``--seq`` token ids (default 2 x 16), ``torch.no_grad()``, ``torch.set_num_threads(1)``,
model in eval mode. So small a forward that what a watch adds per forward, whatever the model,
is most of the difference.

In one process, plain and watched rounds alternate (``--rounds``, each ``--forwards`` forwards,
after a warm-up of each); a round's time is the CPU time of this thread (``time.thread_time``:
other processes on a shared machine count less than in wall time) divided by its forwards. ONE
watch (``--level``) is made for the whole process and entered around each of its rounds, as a
user leaves one on around a loop: the rounds see its steady state (folding, reused rows), and
its attach and detach are not timed. The figure is the median over rounds of watched minus the
median of plain, in µs per forward.

``--trees A,B`` runs this script once per tree (``PYTHONPATH=tree``) in child processes,
alternating the trees, ``--processes`` times each, and prints the per-tree medians: a before and
an after measured interleaved on the same machine at the same load.

``--profile N``: instead, cProfile over N watched forwards, the hook time split into parts by
where it is spent (the table of BENCHMARKS.md's issue-36 section). ``--bytecodes N``: the Python
bytecodes nan_hunter executes per watched forward, per part and per function (``sys.settrace``
opcode events): exact and independent of the machine's load, though blind to time spent in C
(the torch ops, torch's own hook dispatch). ``--parts N``: what each part costs in time, by taking
it away: N pairs of (10 plain forwards, 10 forwards under the watch with one part switched off,
by patching the seam it runs behind), the median of the pairs' differences per variant; beside
them, hooks that do nothing on the same modules (torch's own hook dispatch: the floor of any
design that hooks these modules). Paired and interleaved, so a machine whose speed drifts by tens
of percent from minute to minute (a shared VM) still gives differences; a part's cost is the
whole watch's difference minus that variant's.

    python bench/fixed_cost.py                                   # 7 rounds x 200 forwards, blocks
    python bench/fixed_cost.py --trees /work/wt-base,/work/wt-perf --processes 3
    python bench/fixed_cost.py --profile 300
    python bench/fixed_cost.py --bytecodes 20
    python bench/fixed_cost.py --parts 150 --batch 1 --seq 1     # a decode-shaped forward
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def build(batch: int, seq: int):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(ROOT / "examples" / "tiny-llama-fp16"), dtype=torch.float32
    )
    ids = torch.randint(3, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    return model.eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def per_forward(fn, n: int) -> float:
    """CPU seconds of this thread per call of ``fn``, over ``n`` calls."""
    t = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t) / n


def measure(a) -> dict:
    import torch

    import nan_hunter

    torch.set_num_threads(1)
    model, inputs = build(a.batch, a.seq)

    def fwd():
        with torch.no_grad():
            return model(**inputs)

    ref = fwd().logits
    w = nan_hunter.watch(model, level=a.level)
    with w:
        same = torch.equal(fwd().logits, ref)  # outputs bitwise equal with and without the watch
        per_forward(fwd, a.forwards)  # warm-up
    per_forward(fwd, a.forwards)
    plain, watched = [], []
    for _ in range(a.rounds):
        plain.append(per_forward(fwd, a.forwards))
        with w:
            watched.append(per_forward(fwd, a.forwards))
    rep = w.report()
    return {
        "plain_ms": [round(x * 1e3, 4) for x in plain],
        "watched_ms": [round(x * 1e3, 4) for x in watched],
        "fixed_us": round((statistics.median(watched) - statistics.median(plain)) * 1e6, 1),
        "same_logits": same,
        "fault": rep.first_nonfinite is not None,
        "forwards_seen": w.n_forwards,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


#: the parts of a watched forward's hook time, by where the profiled function lives (first match)
PARTS = (
    (
        "CPU statistics (quick_row, finite_row, aminmax, host reads)",
        ("reference.py:", "aminmax", "'item'", "_foreach", "'tolist'"),
    ),
    ("walking arguments and outputs for float tensors", ("floats.py:", "tree.py:")),
    (
        "root call (step bookkeeping, snapshot, context)",
        (
            "snapshot.py",
            "context.py",
            "_root_starts",
            "on_root_call",
            "training_state.py",
            "get_rng_state",
            "weights_version",
            "_drop_old_inputs",
            "keeps_inputs",
            "get_state",
        ),
    ),
    ("parameter rows (_params)", ("_params",)),
    (
        "judging and folding (_finish, _fold, _judge)",
        (
            "_finish",
            "_fold",
            "_judge",
            "_clean",
            "_rows_of",
            "free",
            "on_forward_end",
            "fault_policy.py",
            "on_forget",
            "host_table",
            "late_phases",
            "_rows_on_host",
        ),
    ),
    ("measuring bookkeeping (identity cache, rows, refs)", ("sink.py", "_measure")),
)


def bytecodes(a) -> None:
    """``--bytecodes``: nan_hunter's Python bytecodes per watched forward, by part and function."""
    import collections

    import torch

    import nan_hunter

    torch.set_num_threads(1)
    model, inputs = build(a.batch, a.seq)
    count: collections.Counter = collections.Counter()

    def tracer(frame, event, arg):
        code = frame.f_code
        if "nan_hunter" not in code.co_filename:
            return None
        frame.f_trace_opcodes = True
        key = f"{Path(code.co_filename).name}:{code.co_name}"

        def local(frame, event, arg):
            if event == "opcode":
                count[key] += 1
            return local

        return local

    with torch.no_grad(), nan_hunter.watch(model, level=a.level):
        for _ in range(50):
            model(**inputs)
        sys.settrace(tracer)
        for _ in range(a.bytecodes):
            model(**inputs)
        sys.settrace(None)
    n = a.bytecodes
    parts: collections.Counter = collections.Counter()
    for key, v in count.items():
        parts[next((p for p, keys in PARTS if any(k in key for k in keys)), "hook bodies and the rest")] += v
    print(f"nan_hunter bytecodes per watched forward (level {a.level}): {sum(count.values()) / n:.0f}")
    for part, v in parts.most_common():
        print(f"  {v / n:7.0f}  {part}")
    for key, v in count.most_common(a.top or 12):
        print(f"      {v / n:7.0f}  {key}")


def profile(a) -> None:
    import cProfile
    import pstats

    import torch

    import nan_hunter

    torch.set_num_threads(1)
    model, inputs = build(a.batch, a.seq)
    with torch.no_grad(), nan_hunter.watch(model, level=a.level):
        for _ in range(50):
            model(**inputs)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.profile):
            model(**inputs)
        prof.disable()
    st = pstats.Stats(prof)
    hooks = [v for k, v in st.stats.items() if _ours(k) and k[2] == "hook"]
    total = sum(v[3] for v in hooks)  # cumulative time of the hook functions (none nests in another)
    mine = _called_from_hooks(st)
    own: dict[str, float] = {}
    for key, v in st.stats.items():
        # tottime of what the hooks call: all of it for our functions and those only we call, the
        # part called from ours for the rest (torch ops the model calls too)
        t = v[2] if key in mine else sum(c[2] for caller, c in v[4].items() if caller in mine)
        if not t:
            continue
        name = f"{Path(key[0]).name}:{key[2]}"
        part = next((p for p, keys in PARTS if any(k in name for k in keys)), REST)
        own[part] = own.get(part, 0.0) + t
    own[REST] = own.get(REST, 0.0) + max(0.0, total - sum(own.values()))
    print(
        f"hook time {total / a.profile * 1e6:.0f} µs per forward (profiled), {a.profile} forwards, load "
        f"{os.getloadavg()[0]:.2f}"
    )
    for part, t in sorted(own.items(), key=lambda kv: -kv[1]):
        print(f"  {t / a.profile * 1e6:7.0f} µs  {100 * t / total:5.1f} %  {part}")
    if a.top:
        st.sort_stats("tottime").print_stats(a.top)


REST = "the rest (hook bodies, stack, dynamo's wrapper of the root hooks)"


def _ours(key) -> bool:
    return "nan_hunter" in key[0]


def _called_from_hooks(st) -> set:
    """Our functions, and (to a fixpoint) the functions called only by those."""
    mine = {k for k in st.stats if _ours(k)}
    grew = True
    while grew:
        grew = False
        for k, v in st.stats.items():
            if k not in mine and v[4] and all(c in mine for c in v[4]):
                mine.add(k)
                grew = True
    return mine


def _ablations(listener_type: type) -> list[tuple[str, list[tuple[Any, str, Any]]]]:
    """``--parts``: (what is switched off, [(module or class, attribute, replacement)]); a seam a
    tree does not have is reported as not measured."""
    from nan_hunter.capture import recorder, sink

    return [
        (
            "root context (ForwardContext.now: autocast, RNG state)",
            [(listener_type, "on_root_call", lambda self, step: None)],
        ),
        ("input snapshot (Snapshot.of)", [(listener_type, "keeps_inputs", lambda self: False)]),
        (
            "statistics (StatsSink.measure_host: aminmax, read, rows)",
            [(sink.StatsSink, "measure_host", lambda self, items, cache=True, new_rows=None: [])],
        ),
        (
            "walking arguments and outputs, and their statistics",
            [
                (recorder, "call_items", lambda args, kwargs: []),
                (recorder, "float_items", lambda obj, prefix="": []),
            ],
        ),
        (
            "parameter rows (Recorder._params)",
            [(recorder.Recorder, "_params", lambda self, name, module: [])],
        ),
        (
            "per-module aggregates when a forward is folded (Recorder._fold; its rows still given back)",
            [(recorder.Recorder, "_fold", _fold_without_aggregates)],
        ),
    ]


def _fold_without_aggregates(self, forwards) -> None:
    for f in forwards:
        if f != self.first_failed:
            self._detail.pop(f, None)
            self.sink.free(self._owned.pop(f, []))
            self._param_use.pop(f, None)
            self._weights_at.pop(f, None)
            self.listener.on_forget(f)


def parts(a) -> None:
    """``--parts``: the watch's cost per forward and what switching each part off saves (see the
    module docstring)."""
    import contextlib

    import torch

    import nan_hunter
    from nan_hunter.capture.blocks import main_blocks

    torch.set_num_threads(1)
    model, inputs = build(a.batch, a.seq)

    def block(n: int = 10) -> float:
        t = time.thread_time()
        with torch.no_grad():
            for _ in range(n):
                model(**inputs)
        return (time.thread_time() - t) / n

    w = nan_hunter.watch(model, level=a.level)

    @contextlib.contextmanager
    def off(patches):
        old = []  # (object, attribute, its own value or None when inherited)
        try:
            for obj, attr, new in patches:
                old.append((obj, attr, vars(obj).get(attr)))
                setattr(obj, attr, new)
            with w:
                yield
        finally:
            for obj, attr, v in old:
                if v is None:
                    delattr(obj, attr)  # inherited: the class's own attribute goes again
                else:
                    setattr(obj, attr, v)

    blocks = set(main_blocks(model))
    hooked = [m for n, m in model.named_modules() if n == "" or a.level == "modules" or n in blocks]

    @contextlib.contextmanager
    def noop_hooks():
        hs = [
            h
            for m in hooked
            for h in (
                m.register_forward_pre_hook(lambda *x: None, with_kwargs=True),
                m.register_forward_hook(lambda *x: None, with_kwargs=True, always_call=True),
            )
        ]
        try:
            yield
        finally:
            for h in hs:
                h.remove()

    variants: list[tuple[str, Any]] = [
        ("the whole watch", lambda: off([])),
        ("hooks that do nothing", noop_hooks),
    ]
    for label, patches in _ablations(type(w.listener)):
        if all(hasattr(o, attr) for o, attr, _ in patches):
            variants.append((f"without {label}", lambda p=patches: off(p)))
        else:
            print(f"  (not measured in this tree: {label})")
    with w:
        block(200)
    block(200)
    diffs: dict[str, list[float]] = {k: [] for k, _ in variants}
    for _ in range(a.parts):
        for k, ctx in variants:
            plain = block()
            with ctx():
                diffs[k].append(block() - plain)
    med = {k: statistics.median(v) for k, v in diffs.items()}
    whole = med["the whole watch"]
    print(
        f"watched forward minus plain, median of {a.parts} pairs of 10 forwards (level {a.level}, batch "
        f"{a.batch} x {a.seq}, load {os.getloadavg()[0]:.2f}):"
    )
    for k, v in med.items():
        d = sorted(diffs[k])
        part = (
            ""
            if k in ("the whole watch", "hooks that do nothing")
            else f"   -> that part: {(whole - v) * 1e6:5.0f} µs"
        )
        print(
            f"  {v * 1e6:6.0f} µs (IQR {d[len(d) // 4] * 1e6:.0f}..{d[3 * len(d) // 4] * 1e6:.0f})  {k}{part}"
        )


def trees(a) -> int:
    paths = [str(Path(p).resolve()) for p in a.trees.split(",")]
    args = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--level",
        a.level,
        "--rounds",
        str(a.rounds),
        "--forwards",
        str(a.forwards),
        "--batch",
        str(a.batch),
        "--seq",
        str(a.seq),
        "--json",
        "-",
    ]
    res: dict[str, list[dict]] = {p: [] for p in paths}
    for i in range(a.processes):
        for p in paths if i % 2 == 0 else paths[::-1]:
            env = dict(os.environ, PYTHONPATH=p)
            out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            res[p].append(r)
            print(
                f"{p}: plain {statistics.median(r['plain_ms']):.3f} ms, watched "
                f"{statistics.median(r['watched_ms']):.3f} ms, fixed cost {r['fixed_us']:.0f} µs "
                f"(load {r['load_avg'][0]}, same logits {r['same_logits']})",
                flush=True,
            )
    for p, rs in res.items():
        fixed = [r["fixed_us"] for r in rs]
        print(
            f"{p}: fixed cost µs {' · '.join(f'{x:.0f}' for x in fixed)} -> median {statistics.median(fixed):.0f}"
        )
    if a.json and a.json != "-":
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--level", default="blocks", choices=["sentinel", "blocks", "modules"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--forwards", type=int, default=200, help="forwards per round")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--trees", default=None, help="comma list of source trees to compare, interleaved")
    ap.add_argument("--processes", type=int, default=3, help="with --trees: processes per tree")
    ap.add_argument("--profile", type=int, default=0, help="cProfile this many watched forwards instead")
    ap.add_argument(
        "--bytecodes", type=int, default=0, help="count nan_hunter's bytecodes over this many forwards"
    )
    ap.add_argument(
        "--parts", type=int, default=0, help="pairs per variant: what each part costs, by taking it away"
    )
    ap.add_argument("--top", type=int, default=0, help="with --profile: also print the top functions")
    ap.add_argument("--json", default=None, help="write the result here ('-': print it as the last line)")
    a = ap.parse_args(argv)
    if a.trees:
        return trees(a)
    if a.profile:
        profile(a)
        return 0
    if a.bytecodes:
        bytecodes(a)
        return 0
    if a.parts:
        parts(a)
        return 0
    r = measure(a)
    if a.json == "-":
        print(json.dumps(r))
        return 0
    print(
        f"plain {statistics.median(r['plain_ms']):.3f} ms, watched {statistics.median(r['watched_ms']):.3f} ms "
        f"per forward: fixed cost {r['fixed_us']:.0f} µs (level {a.level}, load {r['load_avg'][0]}, "
        f"same logits {r['same_logits']}, fault {r['fault']})"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=2))
    return 0 if r["same_logits"] and not r["fault"] else 1


if __name__ == "__main__":
    sys.exit(main())
