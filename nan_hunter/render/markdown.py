"""The Markdown report (for PR comments, wikis, job summaries): the same content as the HTML
report, with the plot written next to it as a PNG (``report.md`` → ``report.png``, or
``report-1.png``, ``report-2.png``... for several checkpoints) and linked relatively."""

from __future__ import annotations

from pathlib import Path

from ..errors import BadInput
from ..report import Report
from .html import (
    check_rows,
    lead_rows,
    matrix_rows,
    meta_rows,
    near_miss_lines,
    plot_or_note,
    replay_rows,
    title_of,
    verdict_line,
    weights_rows,
    where_rows,
)

ICON = {"pass": "✅", "warn": "⚠️", "fail": "❌"}


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: list[list[str]], hit: int | None = None) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows):
        cells = [_cell(c) for c in r]
        if i == hit:
            cells = [f"**{c}**" if c else c for c in cells]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _section(rep: Report, png_name: str | None, why: str | None) -> list[str]:
    md = [f"- **{k}**: `{v}`" for k, v in meta_rows(rep)] + ["", f"> **{verdict_line(rep)}**", ""]
    if rep.check is not None:
        head, rows = check_rows(rep)
        md += ["### Check results", ""] + _table(head, [[f"{ICON[r[0]]} {r[0]}", f"`{r[1]}`", r[2]] for r in rows])
    d = rep.diagnosis
    if d is not None or rep.first_nonfinite is not None:
        md += ["### Diagnosis", ""]
        if d is not None:
            md += [f"**`{d.cause}`** — {d.summary}", ""]
            if d.module is not None or d.op:
                md += [f"**where**: `{d.module or '<root>'}` `{d.op or ''}` ({d.dtype})", ""]
            md += [f"- {e}" for e in d.evidence] + ["", f"**Fix**: {d.fix}", ""]
        if rep.first_nonfinite is not None:
            md += ["**First non-finite value**", ""] + [f"- {k}: `{v}`" for k, v in where_rows(rep)] + [""]
            head, rows, hit = lead_rows(rep)
            if rows:
                md += ["Calls leading to it (execution order):", ""] + _table(head, rows, hit)
    if (rep.check or {}).get("runs"):
        head, rows = matrix_rows(rep)
        md += ["### Forward per dtype", ""] + _table(head, rows)
    if rep.replay:
        head, rows = replay_rows(rep)
        md += ["### Replay of the failing region (vs float64)", ""] + _table(head, rows)
    md += ["### Plot", ""]
    md += [f"![{'output absmax per module call' if rep.modules else 'weights absmax per tensor'}]({png_name})", ""] \
        if png_name else [f"_{why}_", ""]
    head, rows, more = weights_rows(rep)
    md += ["### Weights", ""]
    if rows:
        md += _table(head, rows) + ([f"… {more} more (see the JSON report)", ""] if more else [])
    else:
        md += [f"{(rep.weights or {}).get('n_tensors', 0)} tensors: none non-finite, none near a dtype limit.", ""]
    if rep.near_misses or rep.notes:
        md += ["### Near misses and notes", ""]
        md += [f"- near miss: {m}" for m in near_miss_lines(rep)] + [f"- note: {n}" for n in rep.notes] + [""]
    return md


def write_markdown(reps: Report | list[Report], path: str) -> list[str]:
    """Write ``path`` and its PNG(s); returns notes for the user (matplotlib missing)."""
    reps = [reps] if isinstance(reps, Report) else reps
    p = Path(path)
    md = [f"# {title_of(reps)}", ""]
    notes: list[str] = []
    for i, rep in enumerate(reps):
        png, why = plot_or_note(rep)
        png_path = p.with_suffix(".png") if len(reps) == 1 else p.with_name(f"{p.stem}-{i + 1}.png")
        if png:
            try:
                png_path.write_bytes(png)
            except OSError as e:
                raise BadInput(f"--report {path}: cannot write {png_path} ({e.strerror})") from None
        elif why and "matplotlib" in why and why not in notes:
            notes.append(why)
        if len(reps) > 1:
            md += [f"## {(rep.checkpoint or {}).get('path')}", ""]
        md += _section(rep, png_path.name if png else None, why)
    try:
        p.write_text("\n".join(md).rstrip() + "\n", encoding="utf-8")
    except OSError as e:
        raise BadInput(f"--report {path}: cannot write ({e.strerror})") from None
    return notes
