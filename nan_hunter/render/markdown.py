"""The Markdown report (for PR comments, wikis, job summaries): the same content as the HTML
report, from the same ``rows``, with each plot a PNG beside the file, linked relatively.

Every string goes through ``escape.markdown`` (``<code>`` for names): nothing from a tensor name
can open a tag, a link, a table cell or a mention once GitHub renders the file.
"""

from __future__ import annotations

from urllib.parse import quote

from ..report import Report
from .escape import markdown as esc
from .escape import markdown_code as code
from .escape import markdown_prose as prose
from .headroom import Strip, StripCall, strip
from .rows import (
    CAVEAT_HEAD,
    CHECK_HEAD,
    LEAD_HEAD,
    MATRIX_HEAD,
    QUANT_HEAD,
    REPLAY_HEAD,
    WEIGHTS_HEAD,
    WEIGHTS_MAX_ROWS,
    caveat_rows,
    check_rows,
    check_verdict,
    diagnosis,
    lead_rows,
    matrix_rows,
    meta_rows,
    near_miss_lines,
    quantized_rows,
    replay_rows,
    title,
    verdict,
    weights_rows,
    where_rows,
)

EMOJI = {"pass": "✅", "warn": "⚠️", "fail": "❌"}
BAR = 20  # cells of the headroom bar


def _table(head: list[str], rows: list[list[str]], hit: int | None = None) -> list[str]:
    """Rows of already escaped cells."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows):
        out.append("| " + " | ".join(f"**{c}**" if i == hit and c else c for c in r) + " |")
    return out + [""]


def _plain(rows: list[list[str]]) -> list[list[str]]:
    return [[esc(c) for c in r] for r in rows]


def _strip(s: Strip) -> list[str]:
    rows = []
    for it in s.items:
        if not isinstance(it, StripCall):
            rows.append(["", esc(it.text), "", "", "", "", "", ""])
            continue
        n = round(it.fill * BAR)
        name = (f"#{it.input_index} " if it.input_index is not None else "") + it.module
        rows.append(
            [
                "▶" if it.producer else "",
                "&nbsp;" * 2 * min(it.depth, 6) + code(name),
                esc(it.module_type),
                "█" * n + "·" * (BAR - n),
                esc(it.absmin),
                esc(it.absmax),
                esc(it.headroom),
                esc(it.flush),
            ]
        )
    head = [
        "",
        "module",
        "type",
        f"log10 \\|out\\| → {esc(s.dtype)} max",
        "abs-min",
        "absmax",
        "headroom",
        f"→0 in {esc(s.flush_dtype)}",
    ]
    if not s.has_absmin:  # not measured (a --generate run): no column of dashes
        head, rows = head[:4] + head[5:], [r[:4] + r[5:] for r in rows]
    return [f"**{esc(s.title)}**", ""] + _table(head, rows)


def _diagnosis(rep: Report) -> list[str]:
    md = ["### Diagnosis", ""]
    d = diagnosis(rep)
    if d is not None:
        md[0] = f"### Diagnosis: {code(d.cause)}"
        md += [prose(d.summary), ""]
        if d.where is not None:
            module, op, dtype = d.where
            md += [f"**where**: {code(module)} {code(op)} ({esc(dtype)})", ""]
        md += (
            [f"- {prose(e)}" for e in d.evidence]
            + ["", f"**Fix**: {prose(d.fix)}", ""]
            + ([f"*{prose(d.check)}*", ""] if d.check else [])
        )
        if d.alternatives:  # contract v1.4: each with its own check, never merged into the fix
            md += (
                ["Other proposals (each with its own check):", ""]
                + [f"- {prose(a)}" for a in d.alternatives]
                + [""]
            )
    if rep.first_nonfinite is not None:
        md += (
            ["**First non-finite value**", ""] + [f"- {esc(k)}: {code(v)}" for k, v in where_rows(rep)] + [""]
        )
        rows, hit = lead_rows(rep)
        if rows:
            md += ["Calls leading to it (execution order):", ""] + _table(LEAD_HEAD, _plain(rows), hit)
    s = strip(rep) if rep.exit_code() != 0 else None
    if s is not None:
        md += _strip(s)
    return md


def _section(rep: Report, png_name: str | None, why: str | None) -> list[str]:
    md = [f"- **{esc(k)}**: {code(v)}" for k, v in meta_rows(rep)] + [
        "",
        f"> **{esc(verdict(rep).text)}**",
        "",
    ]
    if rep.check is not None:
        rows = [[f"{EMOJI[s]} {s}", code(rule), esc(msg)] for s, rule, msg in check_rows(rep)]
        md += ["### Check results", ""] + _table(CHECK_HEAD, rows)
    if rep.diagnosis is not None or rep.first_nonfinite is not None:
        md += _diagnosis(rep)
    if (rep.check or {}).get("runs"):
        md += ["### Forward per dtype", ""] + _table(MATRIX_HEAD, _plain(matrix_rows(rep)))
    if rep.replay:
        md += ["### Replay of the failing region (vs float64)", ""] + _table(
            REPLAY_HEAD, _plain(replay_rows(rep))
        )
    alt = "output absmax per module call" if rep.modules else "weights absmax per tensor"
    if png_name:
        md += ["### Plot", "", f"![{alt}]({quote(png_name)})", ""]
    elif why and "matplotlib" in why:  # what to install for it; with nothing to plot there is no section
        md += ["### Plot", "", f"_{esc(why)}_", ""]
    w = weights_rows(rep, max_rows=WEIGHTS_MAX_ROWS)
    md += ["### Weights", ""]
    if w.rows:
        rows = [[code(r[0]), *(esc(c) for c in r[1:])] for r in w.rows]
        md += _table(WEIGHTS_HEAD, rows) + (
            [f"… {w.hidden} more (see the JSON report)", ""] if w.hidden else []
        )
    else:
        md += [
            f"{(rep.weights or {}).get('n_tensors', 0)} tensors: none non-finite, none near a dtype limit.",
            "",
        ]
    qrows, qhidden = quantized_rows(rep)
    if qrows:
        md += ["#### Quantized weights: bad blocks", ""]
        md += _table(
            QUANT_HEAD, [[code(r[0]), esc(r[1]), code(r[2]), *(esc(c) for c in r[3:])] for r in qrows]
        )
        md += [f"… {qhidden} more (see the JSON report)", ""] if qhidden else []
    crows = caveat_rows(rep)
    if crows:
        md += ["#### Suspicious or not checked", ""] + _table(
            CAVEAT_HEAD, [[code(r[0]), esc(r[1])] for r in crows]
        )
    near, _ = near_miss_lines(rep)
    if near or rep.notes:
        md += ["### Near misses and notes", ""]
        md += [f"- near miss: {prose(m)}" for m in near] + [f"- note: {prose(n)}" for n in rep.notes] + [""]
    return md


def render_markdown(reps: list[Report], plots: list[tuple[str | None, str | None]]) -> str:
    """The Markdown text; ``plots`` gives per report the PNG's file name (relative to the
    Markdown file) or why there is no plot."""
    md = [f"# {esc(title(reps))}", ""]
    if len(reps) > 1:
        md += [f"> **{esc(check_verdict(reps, 10_000).text)}**", ""]
    for rep, (png_name, why) in zip(reps, plots):
        if len(reps) > 1:
            md += [f"## {code((rep.checkpoint or {}).get('path'))}", ""]
        md += _section(rep, png_name, why)
    return "\n".join(md).rstrip() + "\n"
