"""How far ahead the overflow forecast and the precursor warnings speak before the first NaN, and
how often they speak on runs that do not diverge (issue 46).

Per seed, three tiny models trained on CPU under fp16 autocast with AdamW and
``nan_hunter.watch(sample_every=2)`` (``tests/models/diverging_lm.py``):

- diverging: Llama at lr 0.1 (no mitigation);
- mitigated: Qwen3 (qk-layernorm) with z-loss 1e-4·log²Z at lr 0.1;
- clean: Llama at lr 1e-3.

Prints, per seed: the first non-finite step, the first warning (and its code), the lead, the
first fp16 crossing the forecast projected (the step it was made at, the step it named) and the
projection at the last sampled step, and the first sampled step from which every projection
names the actual NaN step within 10 % (``acc@``); then the warnings on the mitigated and clean runs (false
alarms). Writes the rows as JSON to ``bench/_out/forecast_lead.json``.

    python bench/forecast_lead.py --seeds 0,1,2,3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "tests"))
from models.diverging_lm import train  # noqa: E402

RUNS = {"diverging": ("llama", 0.1, 0.0), "mitigated": ("qwen3", 0.1, 1e-4), "clean": ("llama", 1e-3, 0.0)}


def cost(rounds: int, steps: int) -> None:
    """Median seconds per training step of the clean run's model: unwatched; sentinel never sampling
    (``sample_every=0``); sentinel with steps left unsampled (``sample_every`` past the run: the
    forecast's state exists, nothing is hooked); every step sampled with and without the forecast's
    signals (``w.samplers`` emptied). Variants interleaved, ``rounds`` rounds."""
    import statistics
    import time

    import torch
    from models.diverging_lm import batch, build

    import nan_hunter

    def run(kind: str) -> float:
        model = build("llama", 0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(0)
        every = {"sentinel, sample_every=0": 0, "sentinel, none sampled": 10**6}.get(kind, 1)
        w = nan_hunter.watch(model, optimizer=opt, sample_every=every) if kind != "plain" else None
        if w is not None:
            w.__enter__()
            if kind == "every step sampled, no signals":
                w.samplers.clear()
        t0 = time.perf_counter()
        for _ in range(steps):
            x = batch(g)
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        dt = (time.perf_counter() - t0) / steps
        if w is not None:
            w.__exit__(None, None, None)
        return dt

    kinds = [
        "plain",
        "sentinel, sample_every=0",
        "sentinel, none sampled",
        "every step sampled, no signals",
        "every step sampled, with signals",
    ]
    got: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(rounds):
        for k in kinds:
            got[k].append(run(k))
    base = statistics.median(got["plain"])
    for k in kinds:
        m = statistics.median(got[k])
        print(
            f"{k:<36} {1e3 * m:8.2f} ms/step  {m / base:5.3f}x plain  (rounds: "
            f"{', '.join(f'{1e3 * v:.2f}' for v in got[k])})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    ap.add_argument("--steps", type=int, default=160, help="training steps at most per run")
    ap.add_argument("--sample-every", type=int, default=2)
    ap.add_argument("--attn", default="sdpa", help="sdpa | eager")
    ap.add_argument(
        "--cost",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead: the cost per step, ROUNDS interleaved rounds of --steps steps",
    )
    a = ap.parse_args()
    if a.cost:
        return cost(a.cost, a.steps)
    rows = []
    print(
        f"{'seed':>4} {'run':<10} {'nan':>5} {'warn':>5} {'lead':>5} {'codes':<34} {'fc@':>4} {'fc→':>5} "
        f"{'last→':>6} {'acc@':>5} {'s':>5}"
    )
    for seed in [int(s) for s in a.seeds.split(",")]:
        for kind, (arch, lr, z) in RUNS.items():
            r = train(arch, lr, seed, z, a.steps, a.sample_every, a.attn)
            codes = ",".join(sorted({w["code"] for w in r.warnings})) or "-"
            row = {
                "seed": seed,
                "run": kind,
                "arch": arch,
                "lr": lr,
                "z_loss": z,
                "steps": r.steps,
                "nan_step": r.nan_step,
                "watch_step": r.watch_step,
                "first_warning": r.first_warning,
                "lead": r.lead(r.first_warning),
                "codes": codes,
                "warnings": len(r.warnings),
                "forecast_step": r.forecast_step,
                "forecast_projected": r.forecast_projected,
                "last_projected": r.last_projected,
                "accurate_from": r.first_accurate(),
                "forecast_lead": r.lead(r.first_accurate()),
                "seconds": round(r.seconds, 1),
            }
            rows.append(row)
            print(
                f"{seed:>4} {kind:<10} {_s(r.nan_step):>5} {_s(r.first_warning):>5} {_s(row['lead']):>5} "
                f"{codes:<34} {_s(r.forecast_step):>4} {_s(r.forecast_projected):>5} {_s(r.last_projected):>6} "
                f"{_s(row['accurate_from']):>5} {r.seconds:>5.1f}",
                flush=True,
            )
    div = [r for r in rows if r["run"] == "diverging"]
    quiet = [r for r in rows if r["run"] != "diverging"]
    print(
        f"diverging runs warned before their NaN: {sum(1 for r in div if (r['lead'] or 0) >= 1)}/{len(div)}; "
        f"leads {[r['lead'] for r in div]}"
    )
    print(
        f"forecast within 10% of the NaN step (and staying there) from: leads {[r['forecast_lead'] for r in rows if r['nan_step'] is not None]} "
        f"(runs that reached a NaN, diverging and mitigated)"
    )
    print(
        f"false alarms: {sum(1 for r in quiet if r['warnings'])}/{len(quiet)} mitigated+clean runs warned "
        f"(mitigated {sum(1 for r in quiet if r['run'] == 'mitigated' and r['warnings'])}, "
        f"clean {sum(1 for r in quiet if r['run'] == 'clean' and r['warnings'])})"
    )
    out = ROOT / "bench" / "_out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "forecast_lead.json").write_text(json.dumps(rows, indent=1))


def _s(v: object) -> str:
    return "-" if v is None else str(v)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
