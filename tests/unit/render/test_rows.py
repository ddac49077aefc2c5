"""``render.rows`` and ``render.headroom``: the format-neutral rows every view shares, and the
terminal limits taken as parameters (``near_miss.max_listed``, ``weights.max_rows``,
``weights.targets``)."""

from __future__ import annotations

import io

from rich.console import Console

from nan_hunter.render import rows as R
from nan_hunter.render.headroom import StripCall, StripGap, strip
from nan_hunter.render.terminal import render
from nan_hunter.report import BisectResult, FirstNonfinite, Report


def _weights(n_bad: int, near: list[dict]) -> dict:
    return {
        "n_tensors": n_bad + len(near),
        "nonfinite": [
            {
                "name": f"bad.{i}",
                "dtype": "float32",
                "shape": [2],
                "nan": 1,
                "posinf": 0,
                "neginf": 0,
                "first_index": [0],
            }
            for i in range(n_bad)
        ],
        "near_overflow": near,
    }


def _near(name: str, **headroom: float) -> dict:
    room = {k.replace("_", "-"): v for k, v in headroom.items()}
    return {"name": name, "dtype": "float32", "absmax": 6e4, "overflows": [], "headroom": room}


def _modules(n: int, bad_at: int | None = None) -> list[dict]:
    rows = [
        {
            "module": f"layers.{i}",
            "module_type": "Linear",
            "call_index": 0,
            "input_index": 0,
            "depth": 1,
            "absmax": float(i + 1),
            "in_absmax": 1.0,
            "nan": 0,
            "posinf": 0,
            "neginf": 0,
        }
        for i in range(n)
    ]
    if bad_at is not None:
        rows[bad_at].update(absmax=0.0, posinf=3)
    return rows


def _failing(n: int, bad_at: int) -> Report:
    return Report(
        run={"dtype": "fp16", "device": "cpu", "n_inputs": 1, "failed_inputs": [0]},
        modules=_modules(n, bad_at),
        first_nonfinite=FirstNonfinite(
            0, f"layers.{bad_at}", "Linear", "aten.addmm.default", "posinf", "producer"
        ),
    )


def _text(rep: Report, **limits) -> str:
    buf = io.StringIO()
    render(rep, Console(file=buf, width=120), **limits)
    return buf.getvalue()


def test_weights_rows_keep_max_rows_and_filter_targets():
    rep = Report(weights=_weights(3, [_near("a", fp16=1.5), _near("b", bf16=1.5), _near("c", fp8_e4m3=1.2)]))
    w = R.weights_rows(rep, max_rows=10, targets=("fp16", "fp8-e4m3"))
    assert [r[0] for r in w.rows] == ["bad.0", "bad.1", "bad.2", "a", "c"]  # b: bf16 is not a target
    assert w.bad == [True, True, True, False, False] and w.hidden == 0
    assert w.rows[3][7] == "6e+04 · fp16 1.5x"
    w = R.weights_rows(rep, max_rows=2, targets=("fp16",))
    assert [r[0] for r in w.rows] == ["bad.0", "bad.1"] and w.hidden == 2


def test_near_miss_lines_honour_max_listed():
    rep = Report(near_misses=[{"message": f"m{i}"} for i in range(5)])
    assert R.near_miss_lines(rep, 2) == (["m0", "m1"], 3)
    assert R.near_miss_lines(rep) == ([f"m{i}" for i in range(5)], 0)


def test_terminal_takes_the_limits_as_parameters():
    rep = Report(
        weights=_weights(4, [_near("near.fp16", fp16=1.5), _near("near.bf16", bf16=1.5)]),
        near_misses=[{"message": f"close call {i}"} for i in range(6)],
    )
    default = _text(rep)
    assert "close call 5" in default and "near.fp16" in default and "near.bf16" not in default
    small = _text(rep, near_miss_max_listed=2, weights_max_rows=3, weights_targets=["bf16"])
    assert "close call 1" in small and "close call 2" not in small and "4 more (see --json" in small
    assert "bad.2" in small and "bad.3" not in small and "2 more tensor(s)" in small
    wide = _text(rep, weights_max_rows=10, weights_targets=["bf16"])
    assert "near.bf16" in wide and "near.fp16" not in wide


def test_verdicts():
    assert R.verdict(Report()).tone == "ok"
    assert (
        R.verdict(Report(near_misses=[{"message": "x"}])).text == "✔ no NaN/Inf found in the weights "
        "(weights-only scan) · 1 near miss(es)"
    )
    rep = _failing(3, 1)
    assert R.verdict(rep) == R.Verdict("✘ +inf first produced by layers.1 at aten.addmm (fp16)", "bad")
    bis = Report(bisect=BisectResult("fp16", "fp32", ["a", "b"], 7, True, 0.01))
    assert R.verdict(bis).text.startswith("✔ keep 2 module(s) in fp32")


def test_lead_rows_end_at_the_producer():
    rows, hit = R.lead_rows(_failing(10, 8))
    assert [r[0] for r in rows] == [f"layers.{i}" for i in range(3, 9)] and hit == 5
    assert rows[hit][3] == "—" and rows[hit][5] == "3"  # no finite absmax: —, not 0


def test_strip_keeps_the_producer_and_its_lead_and_collapses_the_rest():
    s = strip(_failing(100, 70), max_rows=40)
    calls = [it for it in s.items if isinstance(it, StripCall)]
    gaps = [it for it in s.items if isinstance(it, StripGap)]
    assert len(calls) == 40 and sum(g.calls for g in gaps) == 60
    assert [c.module for c in calls if c.producer] == ["layers.70"]
    assert {f"layers.{i}" for i in range(66, 71)} <= {c.module for c in calls}
    prod = next(c for c in calls if c.producer)
    assert (prod.absmax, prod.headroom, prod.tone, prod.fill) == ("+inf", "—", "bad", 1.0)
    assert s.dtype == "fp16" and s.max == 65504.0


def test_strip_measures_an_fp8_run_against_its_compute_dtype():
    rep = _failing(3, 2)
    rep.run["dtype"] = "fp8-e4m3"
    s = strip(rep)
    assert s.dtype == "bf16" and "fp8-e4m3 run, activations in bf16 max 3.38953e+38" in s.title


def test_every_view_shows_the_same_rows():
    """Terminal, HTML and Markdown take the strip, the calls leading to the producer and the
    verdict from the same rows: the same numbers in the same order."""
    import re

    from nan_hunter.render.html import render_html
    from nan_hunter.render.markdown import render_markdown

    rep = _failing(60, 50)
    term = _strip_text(rep)
    page = render_html([rep], [(None, "no plot")])
    md = render_markdown([rep], [(None, "no plot")])
    shown = [it.absmax for it in strip(rep).items if isinstance(it, StripCall)]
    html_strip = page.split("headroom per module call")[1].split("</table>")[0]
    # absmax, then headroom and the flush-to-zero share
    assert (
        re.findall(
            r"<td class=num>([^<]+)</td><td class=num>[^<]+</td><td class=num>[^<]+</td></tr>", html_strip
        )
        == shown
    )
    assert [row.split(" | ")[-3] for row in md.splitlines() if "█" in row or "·" * 5 in row] == shown
    # the terminal leaves the flush column out when nothing flushes (these rows carry no flush_frac)
    assert "→0" not in term
    assert [line.split()[-2] for line in term.splitlines() if "█" in line or "·" * 5 in line] == shown
    verdict = R.verdict(rep).text
    assert verdict in term and verdict in page and verdict in md


def _strip_text(rep: Report) -> str:
    buf = io.StringIO()
    render(rep, Console(file=buf, width=120), strip=True)
    return buf.getvalue()


def test_forecast_and_warning_lines():
    rep = Report(mode="watch")
    rep.forecast = [
        {
            "module": m,
            "signal": "absmax",
            "dtype": "fp16",
            "headroom_db": 6.5,
            "rate_db_per_100_steps": -12.25,
            "projected_step": p,
            "confidence": c,
        }
        for m, p, c in (("layers.0", 140, "high"), ("", None, "low"), ("layers.1", 300, "medium"))
    ]
    rep.warnings = [
        {
            "code": "attention_logit_growth",
            "step": 9,
            "module": "layers.0.attn",
            "evidence": ["max |q·k|/√d = 52 at step 9", "rising"],
            "fix": "qk-layernorm",
        }
    ]
    lines, more = R.forecast_lines(rep, 2)
    assert more == 1 and lines[0].startswith("layers.0 absmax: 6.5 dB below the fp16 max, -12.2 dB/100 steps")
    assert "crosses at step 140 (high confidence)" in lines[0]
    assert lines[1].startswith("(root)") and "no projection" in lines[1]
    assert R.warning_lines(rep) == [
        "attention_logit_growth at step 9 in layers.0.attn: max |q·k|/√d = 52 at step 9; "
        "rising — fix: qk-layernorm"
    ]
    assert R.forecast_lines(Report(), 5) == ([], 0) and R.warning_lines(Report()) == []
    rep.forecast = [
        {
            "module": "layers.0",
            "signal": "absmax",
            "dtype": "fp16",
            "headroom_db": -4.5,
            "rate_db_per_100_steps": -12.25,
            "projected_step": 59,
            "confidence": "high",
        }
    ]
    (past,), _ = R.forecast_lines(rep, 5)  # crossed already: said so, no "below ... crosses at"
    assert "4.5 dB past the fp16 max" in past and "already past it" in past and "crosses" not in past
