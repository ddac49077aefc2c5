"""``check`` rules on what the weights scan finds beyond NaN/Inf and headroom, and against a
baseline checkpoint. Each rule is returned as the fields of a ``ci_check.RuleResult``.

Rules (ids are JUnit testcase names and never change meaning):
``weights.quantized`` (fail: a NaN/Inf scale, a zero scale on a block holding data, a bad activation/KV
scale or a zero point of the wrong convention; given only
when the checkpoint has quantized weights), ``weights.suspicious`` (warn: |x| > 1e30 or an all-zero
weight matrix; given only when there is one), ``weights.unchecked`` (warn: tensors that could hold
NaN/Inf but were not checked; given only when there is one), ``headroom_regression.<dtype>``
(``--baseline OLD``: fail when a tensor that fit ``<dtype>`` in OLD overflows it now, or when its
headroom fell below the ``min_headroom_db`` floor; a fall that stays above the floor passes).
"""

from __future__ import annotations

import math
from typing import Any

from ..config import Config
from ..dtypes import HEADROOM_DTYPES, limits
from ..load.quant.base import is_fault, severity

PASS, WARN, FAIL = "pass", "warn", "fail"


def _rule(
    rule: str,
    ck: str,
    status: str,
    message: str,
    dtype: str | None = None,
    value: float | None = None,
    details: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "rule": rule,
        "checkpoint": ck,
        "status": status,
        "message": message,
        "dtype": dtype,
        "value": value,
        "details": details or [],
    }


def weights_extra_rules(ck: str, weights: dict[str, Any]) -> list[dict[str, Any]]:
    """weights.quantized, weights.suspicious, weights.unchecked from a report's ``weights`` block."""
    out = []
    quantized = weights.get("quantized") or []
    if quantized:
        # the worst first (a NaN/Inf scale before a zero one), then checkpoint order
        faulty = sorted((q for q in quantized if any(is_fault(q, b) for b in q["bad_blocks"])), key=severity)
        if faulty:
            q = faulty[0]
            b = min(
                (b for b in q["bad_blocks"] if is_fault(q, b)),
                key=lambda b: {"nan": 0, "inf": 0, "zero": 1}.get(b["problem"], 2),
            )
            if b["problem"] == "zero_point":
                fix = (
                    f"fix: the zero points follow {b.get('found')!r}, the config declares {b.get('declared')!r}: "
                    "set quantization_config.checkpoint_format to the convention stored, or re-export"
                )
            else:
                fix = (
                    "fix: re-run the quantization from the unquantized checkpoint (an eps on zero scales), or "
                    "re-download the shard holding the scales"
                )
            more = f" and {len(faulty) - 1} more quantized weights" if len(faulty) > 1 else ""
            out.append(
                _rule(
                    "weights.quantized",
                    ck,
                    FAIL,
                    f"{q['name']} ({q['format']}): scale {q['scale']} block {b['index']} is {b['scale']} "
                    f"({b['problem']}), {q['n_bad']} of {q['n_blocks']} blocks bad{more}",
                    value=float(len(faulty)),
                    details=[fix],
                )
            )
        else:
            over = [q for q in quantized if q["overflows"].get("fp16")]
            msg = f"{len(quantized)} quantized weights, every scale finite and non-zero where the block holds data"
            if over:
                a = over[0]["dequant_absmax"]
                msg += (
                    f"; {len(over)} dequantize past fp16's max (e.g. {over[0]['name']}: "
                    f"{'non-finite values' if over[0].get('dequant_nonfinite') or a is None else f'{a:.4g}'}; "
                    "see weights.headroom)"
                )
            out.append(_rule("weights.quantized", ck, WARN if over else PASS, msg, value=0.0))
    sus = weights.get("suspicious") or []
    if sus:
        first = ", ".join(f"{s['name']} ({_why(s)})" for s in sus[:3])
        out.append(
            _rule(
                "weights.suspicious",
                ck,
                WARN,
                f"{len(sus)} suspicious tensor(s): {first}{' ...' if len(sus) > 3 else ''}",
                value=float(len(sus)),
                details=[
                    "|x| > 1e30 is uninitialised memory; an all-zero weight matrix is a failed "
                    "load or save: re-export the checkpoint"
                ],
            )
        )
    unchecked = weights.get("unchecked") or []
    if unchecked:
        out.append(
            _rule(
                "weights.unchecked",
                ck,
                WARN,
                f"{len(unchecked)} tensor(s) not checked: "
                + ", ".join(f"{u['name']} ({u['reason']})" for u in unchecked[:3]),
                value=float(len(unchecked)),
            )
        )
    return out


def _why(s: dict[str, Any]) -> str:
    return "all zero" if s["reason"] == "all_zero" else f"|x| {s['absmax']:.3g}"


def headroom_db(absmax: float | None, dtype: str) -> float:
    """20·log10(dtype max / absmax): negative when the tensor overflows, inf for an all-zero one."""
    if not absmax:
        return math.inf
    return 20 * math.log10(limits(dtype).max / absmax)


def baseline_rules(
    ck: str, new: list[Any], old: list[Any], old_path: str, dtypes: list[str], cfg: Config
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """headroom_regression.<dtype> for each checked dtype with a headroom (fp16, bf16, fp8), and
    the report's ``baseline`` block. ``new``/``old``: the two scans' ``TensorScan`` rows."""
    floor = cfg.check.min_headroom_db
    before = {t.name: t for t in old if not t.skipped and t.finite and t.absmax is not None}
    pairs = [
        (t, before[t.name])
        for t in new
        if t.name in before and not t.skipped and t.finite and t.absmax is not None
    ]
    regressions: list[dict[str, Any]] = []
    out = []
    for dt in dtypes:
        if dt not in HEADROOM_DTYPES:
            continue
        mx = limits(dt).max
        found = []
        for t, o in pairs:
            oh, nh = headroom_db(o.absmax, dt), headroom_db(t.absmax, dt)
            newly_over = o.absmax <= mx < t.absmax
            # only a crossing counts: a tensor already under the floor in OLD is weights.headroom's
            # business, and a fall of any size that ends above the floor leaves it far inside the range
            crossed_floor = oh >= floor > nh
            if newly_over or crossed_floor:
                found.append(
                    {
                        "name": t.name,
                        "dtype": dt,
                        "old_absmax": o.absmax,
                        "new_absmax": t.absmax,
                        "old_headroom": oh,
                        "new_headroom": nh,
                    }
                )
        found.sort(key=lambda r: r["new_headroom"] - r["old_headroom"])
        regressions += found
        rule = f"headroom_regression.{dt}"
        if found:
            r = found[0]
            why = "and now overflows it" if r["new_absmax"] > mx else f"below the {floor:g} dB floor"
            more = f"; {len(found) - 1} more tensor(s)" if len(found) > 1 else ""
            out.append(
                _rule(
                    rule,
                    ck,
                    FAIL,
                    f"{r['name']}: {dt} headroom fell from {_db(r['old_headroom'])} to "
                    f"{_db(r['new_headroom'])} (absmax {r['old_absmax']:.4g} -> {r['new_absmax']:.4g}) "
                    f"{why}, against {old_path}{more}",
                    dt,
                    float(len(found)),
                    [f"{x['name']}: {_db(x['old_headroom'])} -> {_db(x['new_headroom'])}" for x in found[:10]]
                    + [f"fix: find the training step that grew {r['name']}, or keep its module in fp32"],
                )
            )
        else:
            out.append(
                _rule(
                    rule,
                    ck,
                    PASS,
                    f"{len(pairs)} tensors compared with {old_path}: none overflows {dt} "
                    f"or fell below the {floor:g} dB headroom floor",
                    dt,
                    0.0,
                )
            )
    return out, {"path": old_path, "compared": len(pairs), "regressions": regressions}


def _db(headroom: float) -> str:
    """ "72.0 dB"; an all-zero tensor's headroom is unbounded."""
    return f"{headroom:.1f} dB" if math.isfinite(headroom) else "∞ dB (all zero)"
