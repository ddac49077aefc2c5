"""``nanhunter diff --report PATH.html``: a self-contained page (inline CSS and SVG, no scripts,
no network) with the verdict, both runs' absmax along A's entries (B's at the entries it pairs
with), the first divergence marked, and the environment keys that differ. Every string from a
trace goes through ``escape.html``."""

from __future__ import annotations

import math
from typing import Any

from .diff_view import lines
from .escape import html as esc
from .html import CSS

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 1100, 340, 60, 20, 20, 40
MAX_POINTS = 4000  # a longer series is drawn as the largest value per bucket


def _log(x: float | None) -> float | None:
    return math.log10(x) if x is not None and x > 0 else None


def _bucketed(values: list[float | None]) -> list[tuple[int, float]]:
    """(x, log10 absmax) points, at most ``MAX_POINTS`` (the largest per bucket)."""
    n = len(values)
    step = max(1, math.ceil(n / MAX_POINTS))
    out = []
    for lo in range(0, n, step):
        vals = [(i, v) for i, v in enumerate(values[lo : lo + step], lo) if v is not None]
        if vals:
            out.append(max(vals, key=lambda p: p[1]))
    return out


def _plot(
    a: list[float | None], b: list[float | None], mark: int | None, bad_a: list[int], bad_b: list[int]
) -> str:
    la, lb = [_log(x) for x in a], [_log(x) for x in b]
    ys = [v for v in la + lb if v is not None]
    if not ys:
        return '<p class="note">no finite absmax to plot</p>'
    lo, hi = math.floor(min(ys)), math.ceil(max(ys))
    hi = hi if hi > lo else lo + 1
    n = max(len(a), 2)

    def x(i: float) -> float:
        return PAD_L + (W - PAD_L - PAD_R) * i / (n - 1)

    def y(v: float) -> float:
        return PAD_T + (H - PAD_T - PAD_B) * (hi - v) / (hi - lo)

    svg = [
        f'<svg viewBox="0 0 {W} {H}" width="100%" role="img" aria-label="absmax per entry" '
        'xmlns="http://www.w3.org/2000/svg" style="background:#fff;border:1px solid #dfe3ea;border-radius:6px">'
    ]
    every = max(1, math.ceil((hi - lo) / 10))  # at most ~10 labelled decades
    for k in range(lo, hi + 1, every):
        svg.append(
            f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y(k):.1f}" y2="{y(k):.1f}" stroke="#eef1f5"/>'
            f'<text x="{PAD_L - 6}" y="{y(k) + 4:.1f}" font-size="11" text-anchor="end" fill="#5f6b7a">'
            f"1e{k}</text>"
        )
    for vals, color, dash in ((la, "#1565c0", ""), (lb, "#ef6c00", ' stroke-dasharray="5 3"')):
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in _bucketed(vals))
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.4"{dash} points="{pts}"/>')
    for idx, color in ((bad_a, "#c62828"), (bad_b, "#6a1b9a")):
        for i in idx[:200]:
            svg.append(f'<circle cx="{x(i):.1f}" cy="{PAD_T + 4}" r="3" fill="{color}"/>')
    if mark is not None:
        svg.append(
            f'<line x1="{x(mark):.1f}" x2="{x(mark):.1f}" y1="{PAD_T}" y2="{H - PAD_B}" stroke="#c62828" '
            f'stroke-width="2"/><text x="{x(mark) + 4:.1f}" y="{PAD_T + 14}" font-size="12" fill="#c62828">'
            "first divergence</text>"
        )
    svg.append(
        f'<text x="{PAD_L}" y="{H - 10}" font-size="12" fill="#5f6b7a">entries of A in execution order '
        f"(0 … {len(a) - 1}) · log10 absmax · A solid blue, B dashed orange · dots: non-finite "
        "(A red, B purple)</text></svg>"
    )
    return "".join(svg)


def _kv(rows: list[tuple[str, Any]]) -> str:
    return (
        '<dl class="kv">'
        + "".join(f'<dt>{esc(k)}</dt><dd class="mono">{esc(v)}</dd>' for k, v in rows)
        + "</dl>"
    )


def page(res: dict[str, Any], series: dict[str, Any]) -> str:
    """The HTML page of a ``nanhunter.diff/v1`` dict; ``series``: ``a``/``b`` absmax per A entry,
    ``bad_a``/``bad_b`` the A positions of non-finite entries, ``mark`` the divergence's A index."""

    head = lines(res)
    d = res["first_divergence"]
    tone = "bad" if res["exit_code"] else "ok"
    h = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>nanhunter diff — {esc(head[0])}</title><style>{CSS}</style></head><body><main>",
        "<h1>nanhunter diff</h1>",
        f'<div class="sub mono">A {esc(res["a"]["path"])}<br>B {esc(res["b"]["path"])}</div>',
        f'<div class="verdict {tone}">{esc(head[0])}</div>',
        f'<p class="outputs">{esc(head[1].strip())}</p>',
        f'<div class="card"><h2>absmax along the entries</h2>'
        f"{_plot(series['a'], series['b'], series.get('mark'), series['bad_a'], series['bad_b'])}</div>",
    ]
    if d is not None:
        rows = [
            ("module", f"{d['module'] or '<root>'} ({d['module_type']})"),
            ("op", d["op"] or "—"),
            ("call · input · step", f"{d['call_index']} · {d['input_index']} · {d['step']}"),
            ("source", f"{d['source_file']}:{d['source_line']}" if d["source_file"] else "—"),
            ("rel_err", "non-finite classes differ" if d["classes_differ"] else f"{d['rel_err']:.3e}"),
            ("tolerance", f"{d['tolerance']:.1e}"),
            ("inputs agree", "yes" if d["inputs_agree"] else "no"),
        ]
        if d.get("unmatched"):
            rows += [
                (f"no counterpart in {s.upper()}", ", ".join(d["unmatched"][s]) or "(none)")
                for s in ("a", "b")
            ]
        stats = [
            "<table><thead><tr><th></th>"
            + "".join(
                f"<th class=num>{k}</th>" for k in ("absmax", "absmin", "mean", "l2", "nan", "+inf", "−inf")
            )
            + "<th>hash</th></tr></thead><tbody>"
        ]
        for side in ("a", "b"):
            s = d[side]
            cells = [s["absmax"], s["absmin"], s["mean"], s["l2"], s["nan"], s["posinf"], s["neginf"]]
            stats.append(
                f"<tr><td>{side.upper()}</td>"
                + "".join(
                    f"<td class=num>{esc('—' if c is None else (f'{c:.4e}' if isinstance(c, float) else c))}</td>"
                    for c in cells
                )
                + f"<td class=mono>{esc(s['hash'] or '—')}</td></tr>"
            )
        stats.append("</tbody></table>")
        h.append(
            f'<div class="card diag"><h2>First divergence</h2>{_kv(rows)}<h3>statistics</h3>{"".join(stats)}</div>'
        )
    env = res["env_diff"]
    if env:
        rows_html = "".join(
            f"<tr><td class=mono>{esc(x['key'])}</td><td class=mono>{esc(x['a'])}</td>"
            f"<td class=mono>{esc(x['b'])}</td></tr>"
            for x in env
        )
        h.append(
            f'<div class="card"><h2>Environment keys that differ</h2><table><thead><tr><th>key</th><th>A</th>'
            f"<th>B</th></tr></thead><tbody>{rows_html}</tbody></table></div>"
        )
    # each line escaped on its own: ``escape.html`` shows a newline inside a string as ``\n``
    h.append(
        '<div class="card"><h2>Details</h2><pre class="mono cmd">'
        + "\n".join(esc(line) for line in head[1:])
        + "</pre></div>"
    )
    h.append("</main></body></html>")
    return "".join(h)
