"""A self-contained HTML report: inline CSS, the plot as a base64 PNG, no scripts, no network.

Content comes from ``rows`` and ``headroom`` (shared with the terminal and Markdown views); every
string goes through ``escape.html`` on its way into the page.
"""

from __future__ import annotations

import base64
from urllib.parse import quote

from ..report import Report
from ..version import __version__
from .escape import html as esc
from .escape import html_prose as prose
from .headroom import Strip, StripCall, strip
from .plot import Plot
from .rows import (
    CAVEAT_HEAD,
    CHECK_HEAD,
    INPUTS_HEAD,
    LEAD_HEAD,
    MATRIX_HEAD,
    QUANT_HEAD,
    REPLAY_HEAD,
    TENSORS_HEAD,
    WEIGHTS_HEAD,
    WEIGHTS_MAX_ROWS,
    Verdict,
    alternative_line,
    caveat_rows,
    check_rows,
    check_verdict,
    command_line,
    diagnosis,
    input_rows,
    lead_rows,
    matrix_rows,
    meta_rows,
    near_miss_lines,
    quantized_rows,
    replay_rows,
    tensor_rows,
    title,
    verdict,
    versions,
    weights_rows,
    where_rows,
)

CSS = """
:root { --red:#c62828; --green:#2e7d32; --amber:#b26a00; --ink:#1d2330; --mute:#5f6b7a; --line:#dfe3ea; }
* { box-sizing: border-box; }
body { margin: 0; background: #f4f6f9; color: var(--ink);
       font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 40px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 0 0 10px; }
h3 { font-size: 14px; margin: 14px 0 6px; color: var(--mute); text-transform: uppercase; letter-spacing: .04em; }
.sub { color: var(--mute); margin-bottom: 18px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 16px 20px; margin: 14px 0;
        box-shadow: 0 1px 2px rgba(20,30,50,.05); }
.verdict { font-size: 18px; font-weight: 650; padding: 14px 20px; border-radius: 10px; margin: 14px 0; color: #fff; }
.verdict.ok { background: var(--green); } .verdict.bad { background: var(--red); }
.verdict.warn { background: var(--amber); }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th { text-align: left; color: var(--mute); font-weight: 600; border-bottom: 2px solid var(--line); padding: 6px 8px; }
th.num { text-align: right; }
td { border-bottom: 1px solid var(--line); padding: 5px 8px; vertical-align: top; }
tr:nth-child(even) td { background: #fafbfc; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.hit td { background: #fdecea !important; font-weight: 600; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0; }
dl.kv dt { color: var(--mute); } dl.kv dd { margin: 0; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 650;
         color: #fff; }
.badge.pass { background: var(--green); } .badge.warn { background: var(--amber); }
.badge.fail { background: var(--red); } .badge.cause { background: #6a1b9a; }
.diag { border-left: 5px solid var(--amber); }
pre.cmd { white-space: pre-wrap; word-break: break-all; background: #f5f5f5; padding: 8px 10px; border-radius: 6px; }
.fix { background: #e8f5e9; border: 1px solid #c8e6c9; border-radius: 8px; padding: 10px 14px; margin-top: 10px; }
.check { margin-top: 6px; font-size: 13px; } .check.ok { color: #1b5e20; font-weight: 600; } .check.bad { color: #b71c1c; font-weight: 600; } .check.none { color: #666; }
.fix b { color: var(--green); }
.alts { border: 1px solid #ddd; border-radius: 8px; padding: 8px 14px; margin-top: 8px; font-size: 13px; color: #444; }
.alts li.ok { color: #1b5e20; } .alts li.bad { color: #b71c1c; }
ul.ev { margin: 6px 0 0; padding-left: 20px; } ul.ev li { margin: 2px 0; }
img.plot { width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
.note { color: var(--mute); } .nm { color: var(--amber); }
.sep { border: 0; border-top: 3px double var(--line); margin: 34px 0; }
footer { color: var(--mute); font-size: 12px; margin-top: 26px; }
.bar { background: #eef1f5; height: 10px; border-radius: 3px; min-width: 120px; }
.bar span { display: block; height: 10px; border-radius: 3px; }
.bar .bad, .bar .tight { background: var(--red); } .bar .close { background: var(--amber); }
.bar .ok { background: var(--green); } .bar .empty { background: transparent; }
td.gap { color: var(--mute); }
"""


def _table(
    head: list[str],
    rows: list[list[str]],
    hit: int | None = None,
    numeric: set[int] | None = None,
    status_col: int | None = None,
) -> str:
    numeric = numeric or set()
    out = [
        "<table><thead><tr>",
        *(f"<th{' class=num' if j in numeric else ''}>{esc(h)}</th>" for j, h in enumerate(head)),
        "</tr></thead><tbody>",
    ]
    for i, row in enumerate(rows):
        out.append('<tr class="hit">' if i == hit else "<tr>")
        for j, cell in enumerate(row):
            if j == status_col:
                out.append(f'<td><span class="badge {esc(cell)}">{esc(cell)}</span></td>')
            else:
                out.append(f"<td{' class=num' if j in numeric else ''}>{esc(cell)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _kv(rows: list[tuple[str, str]], links: dict[str, str] | None = None) -> str:
    """Label/value pairs; a value whose label is in ``links`` is a link to that (escaped) address."""
    links = links or {}

    def value(k: str, v: str) -> str:
        return f'<a href="{esc(links[k])}">{esc(v)}</a>' if k in links else esc(v)

    return (
        '<dl class="kv">'
        + "".join(f'<dt>{esc(k)}</dt><dd class="mono">{value(k, v)}</dd>' for k, v in rows)
        + "</dl>"
    )


def _source_links(rep: Report) -> dict[str, str]:
    """The source line as a link editors and browsers open (``file://``; VS Code: ``vscode://``)."""
    f = rep.first_nonfinite
    if f is None or not f.source:
        return {}
    f.sync_source()
    if not f.source_file or not f.source_file.startswith("/"):
        return {}
    return {"source": "file://" + quote(f.source_file)}


def _reproduce(rep: Report) -> str:
    """Command line, versions, the data set's inputs with their text, every tensor of the checkpoint."""
    h = ['<div class="card"><h2>Reproduce</h2>']
    cmd = command_line(rep)
    if cmd:
        h.append(f'<h3>Command</h3><pre class="mono cmd">{esc(cmd)}</pre>')
    h.append("<h3>Versions</h3>" + _kv(versions()))
    rows = input_rows(rep)
    if rows:
        bad = next((i for i, r in enumerate(rows) if r[2] == "NO"), None)
        h.append("<h3>Inputs</h3>" + _table(INPUTS_HEAD, rows, hit=bad))
    trows, more = tensor_rows(rep)
    if trows:
        h.append("<h3>Weights: every tensor</h3>" + _table(TENSORS_HEAD, trows, numeric={3, 4, 5, 6}))
        if more:
            h.append(f'<p class="note">… {more} more (see the JSON report)</p>')
    h.append("</div>")
    return "".join(h)


def _verdict(v: Verdict) -> str:
    return f'<div class="verdict {v.tone}">{esc(v.text)}</div>'


def _strip(s: Strip) -> str:
    absmin = s.has_absmin  # not measured (a --generate run): no column of dashes
    out = [
        "<table><thead><tr><th></th><th>module</th><th>type</th>",
        f"<th>log10 |out| → {esc(s.dtype)} max</th>"
        + ("<th class=num>abs-min</th>" if absmin else "")
        + "<th class=num>absmax</th><th class=num>headroom</th>"
        f'<th class=num title="share of outputs a cast to {esc(s.flush_dtype)} rounds to zero">→0 in {esc(s.flush_dtype)}</th>',
        "</tr></thead><tbody>",
    ]
    for it in s.items:
        if not isinstance(it, StripCall):
            out.append(
                f'<tr><td></td><td class="gap" colspan="{7 if absmin else 6}">{esc(it.text)}</td></tr>'
            )
            continue
        name = (f"#{it.input_index} " if it.input_index is not None else "") + it.module
        bar = f'<div class="bar"><span class="{it.tone}" style="width:{it.fill * 100:.1f}%"></span></div>'
        out.append(
            f"<tr{' class=hit' if it.producer else ''}><td>{'▶' if it.producer else ''}</td>"
            f'<td class="mono" style="padding-left:{8 + 12 * min(it.depth, 6)}px">{esc(name)}</td>'
            f"<td>{esc(it.module_type)}</td><td>{bar}</td>"
            + (f"<td class=num>{esc(it.absmin)}</td>" if absmin else "")
            + f"<td class=num>{esc(it.absmax)}</td>"
            f"<td class=num>{esc(it.headroom)}</td><td class=num>{esc(it.flush)}</td></tr>"
        )
    out.append("</tbody></table>")
    return f"<h3>{esc(s.title)}</h3>" + "".join(out)


def _alt_tone(a: dict) -> str:
    """ok: verified on the whole model; bad: tried and failed; none: not verified or region only."""
    fv = a.get("fix_verified")
    get = fv.get if isinstance(fv, dict) else (lambda k: getattr(fv, k, None))
    if fv is None:
        return "none"
    if get("finite"):
        return "ok" if get("scope") == "model" else "none"
    return "bad"


def _alternatives(rep: Report) -> str:
    """``diagnosis.alternatives`` (contract v1.4), outside the fix's box: each with its own check, never
    shown as the fix."""
    alts = (rep.diagnosis.alternatives if rep.diagnosis is not None else None) or []
    if not alts:
        return ""
    items = "".join(f'<li class="{_alt_tone(a)}">{prose(alternative_line(a))}</li>' for a in alts)
    return f'<div class="alts"><b>Other proposals</b> (each with its own check)<ul>{items}</ul></div>'


def _diagnosis(rep: Report) -> list[str]:
    d = diagnosis(rep)
    h = ['<div class="card diag"><h2>Diagnosis</h2>']
    if d is not None:
        h[0] = f'<div class="card diag"><h2>Diagnosis <span class="badge cause">{esc(d.cause)}</span></h2>'
        h.append(f"<p>{prose(d.summary)}</p>")
        if d.where is not None:
            module, op, dtype = d.where
            h.append(f"<p><b>where</b> <code>{esc(module)}</code> <code>{esc(op)}</code> ({esc(dtype)})</p>")
        if d.evidence:
            h.append(
                '<h3>Evidence</h3><ul class="ev">'
                + "".join(f"<li>{prose(e)}</li>" for e in d.evidence)
                + "</ul>"
            )
        h.append(
            f'<div class="fix"><b>Fix</b> {prose(d.fix)}'
            + (f'<div class="check {d.check_tone}">{prose(d.check)}</div>' if d.check else "")
            + "</div>"
        )
        h.append(_alternatives(rep))
    if rep.first_nonfinite is not None:
        h.append(f"<h3>First non-finite value</h3>{_kv(where_rows(rep), _source_links(rep))}")
        rows, hit = lead_rows(rep)
        if rows:
            h.append(
                "<h3>Calls leading to it (execution order)</h3>"
                + _table(LEAD_HEAD, rows, hit=hit, numeric={2, 3, 4, 5, 6})
            )
    s = strip(rep) if rep.exit_code() != 0 else None
    if s is not None:
        h.append(_strip(s))
    h.append("</div>")
    return h


def _section(rep: Report, plot: Plot) -> str:
    h = [f'<div class="card">{_kv(meta_rows(rep))}</div>', _verdict(verdict(rep))]
    if rep.check is not None:
        h.append(
            f'<div class="card"><h2>Check results</h2>{_table(CHECK_HEAD, check_rows(rep), status_col=0)}</div>'
        )
    diagnosed = rep.diagnosis is not None or rep.first_nonfinite is not None
    if diagnosed:
        h += _diagnosis(rep)
    s = strip(rep) if not (diagnosed and rep.exit_code() != 0) else None  # else inside the diagnosis
    if s is not None:  # a clean run: how close each call came to the limits, both ends
        h.append(f'<div class="card"><h2>Modules</h2>{_strip(s)}</div>')
    if rep.replay or (rep.check or {}).get("runs"):
        h.append('<div class="card"><h2>Dtype matrix</h2>')
        if (rep.check or {}).get("runs"):
            h.append("<h3>Forward per dtype</h3>" + _table(MATRIX_HEAD, matrix_rows(rep), numeric={6}))
        if rep.replay:
            rows = replay_rows(rep)
            h.append(
                "<h3>Replay of the failing region (vs float64)</h3>"
                + _table(
                    REPLAY_HEAD,
                    rows,
                    hit=next((i for i, r in enumerate(rows) if r[1] == "NO"), None),
                    numeric={2, 3, 4, 5, 6},
                )
            )
        h.append("</div>")
    png, why = plot
    if png:
        alt = "output absmax per module call" if rep.modules else "weights absmax per tensor"
        h.append(
            f'<div class="card"><h2>Plot</h2><img class="plot" alt="{alt}" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}"></div>'
        )
    elif why and "matplotlib" in why:  # what to install for it; with nothing to plot there is no card
        h.append(f'<div class="card"><h2>Plot</h2><p class="note">{prose(why)}</p></div>')
    w = weights_rows(rep, max_rows=WEIGHTS_MAX_ROWS)
    h.append('<div class="card"><h2>Weights</h2>')
    if w.rows:
        h.append(_table(WEIGHTS_HEAD, w.rows, numeric={3, 4, 5}))
        if w.hidden:
            h.append(f'<p class="note">… {w.hidden} more (see the JSON report)</p>')
    else:
        n = (rep.weights or {}).get("n_tensors", 0)
        h.append(f'<p class="note">{n} tensors: none non-finite, none near a dtype limit.</p>')
    qrows, qhidden = quantized_rows(rep)
    if qrows:
        h.append("<h3>Quantized weights: bad blocks</h3>" + _table(QUANT_HEAD, qrows))
        if qhidden:
            h.append(f'<p class="note">… {qhidden} more (see the JSON report)</p>')
    crows = caveat_rows(rep)
    if crows:
        h.append("<h3>Suspicious or not checked</h3>" + _table(CAVEAT_HEAD, crows))
    h.append("</div>")
    h.append(_reproduce(rep))
    near, _ = near_miss_lines(rep)
    if near or rep.notes:
        h.append('<div class="card"><h2>Near misses and notes</h2><ul class="ev">')
        h += [f'<li class="nm">near miss: {prose(m)}</li>' for m in near]
        h += [f'<li class="note">{prose(n)}</li>' for n in rep.notes]
        h.append("</ul></div>")
    return "\n".join(h)


def render_html(reps: list[Report], plots: list[Plot]) -> str:
    """The page for one report or several (``check``), with each report's plot."""

    name = esc(title(reps))
    body = [_verdict(check_verdict(reps, 10_000))] if len(reps) > 1 else []
    for i, (rep, plot) in enumerate(zip(reps, plots)):
        if len(reps) > 1:
            body.append(f"{'<hr class=sep>' if i else ''}<h2>{esc((rep.checkpoint or {}).get('path'))}</h2>")
        body.append(_section(rep, plot))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{name}</title>
<style>{CSS}</style></head>
<body><main>
<h1>{name}</h1>
<div class="sub">nanhunter {esc(__version__)} · report schema nanhunter.report/v1</div>
{chr(10).join(body)}
<footer>Generated by nanhunter {esc(__version__)}. Self-contained: no scripts, no network.</footer>
</main></body></html>
"""
