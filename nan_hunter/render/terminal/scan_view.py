"""The parts of the terminal view of a report: header, weights, producer, diagnosis with the
replay matrix, near misses and notes, verdict. Content comes from ``rows``; every string is
escaped (``escape.terminal``) into a ``Text``, never passed through rich markup."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ...report import Report
from .. import rows as R
from ..escape import terminal as esc
from .layout import Col, hanging, shorten_middle, table

KIND_STYLE = {"nan": "bold red", "posinf": "bold magenta", "neginf": "bold blue"}
TONE_STYLE = {"ok": "bold green", "warn": "bold yellow", "bad": "bold red"}
CHECK_STYLE = {"ok": "bold green", "bad": "bold red", "none": "dim"}
PANEL_CHROME = 4  # border and padding cells a Panel takes from the width


def t(s: object, style: str = "") -> Text:
    """Untrusted text as a rich Text: control characters escaped, markup left literal."""
    return Text(esc(s), style=style)


def header(rep: Report, width: int) -> RenderableType:
    meta = dict(R.meta_rows(rep))
    lines = [(Text("nanhunter", style="bold"), t(meta["checkpoint"], "cyan")), (Text(""), t(meta["format"]))]
    if rep.run:
        failing = bool(rep.run.get("failed_inputs"))
        lines.append((Text("run", style="dim"), t(meta["run"], "red" if failing else "")))
    for key in ("decoding", "capsule", "skipped"):
        if key in meta:
            lines.append((Text(key, style="dim"), t(meta[key])))
    return hanging(lines, width)


def generate_table(rep: Report, width: int) -> Table | None:
    """Prompt sensitivity: per input, whether and at which decode step it went non-finite."""
    rows = R.generate_rows(rep)
    if not rows:
        return None
    cols = [
        Col(R.GENERATE_HEAD[0], [t(r[0]) for r in rows]),
        Col(R.GENERATE_HEAD[1], [t(r[1]) for r in rows], "end", low=12),
        Col(R.GENERATE_HEAD[2], [t(r[2], "red" if r[2].startswith("fails") else "green") for r in rows]),
        Col(R.GENERATE_HEAD[3], [t(r[3]) for r in rows], justify="right"),
    ]
    return table(cols, width, title="decoding per input")


def weights_tables(
    rep: Report, width: int, max_rows: int = R.WEIGHTS_MAX_ROWS, targets: Sequence[str] = R.WEIGHTS_TARGETS
) -> list[RenderableType]:
    """Non-finite tensors, then tensors near a target dtype's max; at most ``max_rows`` rows."""
    w = R.weights_rows(rep, max_rows, targets)
    bad = [r for r, b in zip(w.rows, w.bad) if b]
    near = [r for r, b in zip(w.rows, w.bad) if not b]
    out: list[RenderableType] = []
    if bad:
        cols = [
            Col("tensor", [t(r[0], "red") for r in bad], "name", low=20),
            Col("dtype", [t(r[1]) for r in bad]),
            Col("shape", [t(r[2]) for r in bad]),
            *(
                Col(h, [t(r[j]) for r in bad], justify="right")
                for j, h in ((3, "NaN"), (4, "+inf"), (5, "−inf"))
            ),
            Col("first at", [t(r[6]) for r in bad]),
        ]
        out.append(table(cols, width, title="weights: non-finite"))
    if near:
        cols = [
            Col("tensor", [t(r[0], "yellow") for r in near], "name", low=20),
            Col("dtype", [t(r[1]) for r in near]),
            Col("absmax · headroom", [t(r[7]) for r in near], "text", low=20),
        ]
        out.append(table(cols, width, title="weights: near a dtype's max"))
    if w.hidden:
        out.append(Text(f"… {w.hidden} more tensor(s) (see --json)", style="dim"))
    qrows, qhidden = R.quantized_rows(rep, max_rows)
    if qrows:
        cols = [
            Col(
                h,
                [t(r[j], "red" if j == 0 else "") for r in qrows],
                "name" if j in (0, 2) else "fixed",
                low=12 if j in (0, 2) else 0,
            )
            for j, h in enumerate(R.QUANT_HEAD)
        ]
        out.append(table(cols, width, title="weights: quantized, bad blocks"))
        if qhidden:
            out.append(Text(f"… {qhidden} more bad block(s) (see --json)", style="dim"))
    crows = R.caveat_rows(rep)
    if crows:
        cols = [
            Col("tensor", [t(r[0], "yellow") for r in crows], "name", low=20),
            Col("finding", [t(r[1]) for r in crows], "text", low=20),
        ]
        out.append(table(cols, width, title="weights: suspicious or not checked"))
    return out


def lead_table(rep: Report, width: int) -> Table | None:
    """The calls leading to the producer, the producer marked."""
    rows, hit = R.lead_rows(rep)
    if not rows:
        return None
    mark = [Text("▶" if i == hit else "", style="bold red") for i in range(len(rows))]
    cols = [
        Col("", mark),
        Col(
            R.LEAD_HEAD[0],
            [t(r[0], "bold red" if i == hit else "") for i, r in enumerate(rows)],
            "name",
            low=16,
        ),
        Col(R.LEAD_HEAD[1], [t(r[1]) for r in rows], "end", low=8, optional=True),
        *(Col(h, [t(r[j]) for r in rows], justify="right") for j, h in enumerate(R.LEAD_HEAD[2:], 2)),
    ]
    return table(cols, width)


def producer_panel(rep: Report, width: int) -> Panel | None:
    f = rep.first_nonfinite
    if f is None:
        return None
    styles = {
        "module": "bold",
        "op": "bold",
        "value": KIND_STYLE.get(f.kind, ""),
        "source": "cyan",
        "when": "bold",
    }
    where = R.where_rows(rep)
    room = width - PANEL_CHROME - max(len(k) for k, _ in where) - 1
    # a path is shortened in the middle on one line (its tail names the file), never broken mid-word
    where = [(k, shorten_middle(esc(v), room, "/") if k == "source" else v) for k, v in where]
    parts: list[RenderableType] = [
        hanging([(Text(k, style="dim"), t(v, styles.get(k, ""))) for k, v in where], width - PANEL_CHROME)
    ]
    lead = lead_table(rep, width - PANEL_CHROME)
    if lead is not None:
        parts += [Text(""), Text("last calls (execution order):", style="dim"), lead]
    return Panel(
        Group(*parts),
        title=Text("first non-finite value", style="bold red"),
        title_align="left",
        border_style="red",
    )


def replay_table(rep: Report) -> Table | None:
    rows = R.replay_rows(rep)
    if not rows:
        return None
    tab = Table(
        title=Text("replay of the failing region (vs float64)"),
        title_justify="left",
        show_edge=False,
        header_style="bold",
    )
    for j, c in enumerate(R.REPLAY_HEAD):
        tab.add_column(Text(c), justify="left" if j < 2 else "right", no_wrap=True)
    for r in rows:
        tab.add_row(
            t(r[0]), Text(r[1], style="green" if r[1] == "yes" else "bold red"), *(t(c) for c in r[2:])
        )
    return tab


def diagnosis_panel(rep: Report, width: int) -> Panel | None:
    d = R.diagnosis(rep)
    if d is None:
        return None
    # the cause code is the panel's title: the summary then reads on its own ("matmul overflow in
    # fp16 ..."), never "overflow matmul overflow"
    lines: list[tuple[Text, Text]] = [(Text("what", style="dim"), t(d.summary))]
    if d.where is not None:
        module, op, dtype = d.where
        lines.append((Text("where", style="dim"), t(f"{module}  {op}  ({dtype})")))
    lines += [(Text("  •", style="dim"), t(e)) for e in d.evidence]
    lines.append((Text("fix", style="bold green"), t(d.fix)))
    if d.check:
        lines.append((Text("check", style="dim"), t(d.check, CHECK_STYLE[d.check_tone])))
    lines += [(Text("or", style="dim"), t(a)) for a in d.alternatives]
    inner = width - PANEL_CHROME
    parts: list[RenderableType] = [hanging(lines, inner)]
    tab = replay_table(rep)
    if tab is not None:
        parts += [Text(""), tab]
    title = Text("diagnosis · ", style="bold") + t(d.cause, "bold yellow")
    return Panel(Group(*parts), title=title, title_align="left", border_style="yellow")


def findings(
    rep: Report,
    width: int,
    max_listed: int = R.NEAR_MISS_MAX_LISTED,
    forecast_max_listed: int = R.FORECAST_MAX_LISTED,
) -> Table | None:
    """Near misses (at most ``max_listed``), precursor warnings, the forecast's top entries (at most
    ``forecast_max_listed``) and notes, wrapped lines indented."""
    near, more = R.near_miss_lines(rep, max_listed)
    lines = [(Text("near miss", style="yellow"), t(m)) for m in near]
    if more:
        lines.append(
            (
                Text("near miss", style="yellow"),
                Text(f"… {more} more (see --json, or the report's to_dict())", style="dim"),
            )
        )
    lines += [(Text("warning", style="yellow"), t(w)) for w in R.warning_lines(rep)]
    fc, more = R.forecast_lines(rep, forecast_max_listed)
    lines += [(Text("forecast", style="cyan"), t(f)) for f in fc]
    if more:
        lines.append(
            (
                Text("forecast", style="cyan"),
                Text(f"… {more} more (see --json, or the report's to_dict())", style="dim"),
            )
        )
    lines += [(Text("note", style="dim"), t(n)) for n in rep.notes]
    return hanging(lines, width) if lines else None


def verdict(rep: Report, width: int = R.VERDICT_WIDTH) -> Text:
    """The verdict line: at most 79 cells (less on a narrower console), never wrapped."""
    v = R.verdict(rep, min(R.VERDICT_WIDTH, max(20, width - 1)))
    line = t(v.text, TONE_STYLE[v.tone])
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def bisect_view(rep: Report, width: int) -> RenderableType | None:
    """The modules bisect keeps (and the transformers line), or the inputs that fail."""
    lines = R.bisect_lines(rep)
    if not lines:
        return None
    style = {"keep": "bold", "transformers": "cyan", "failing": "red"}
    return hanging([(Text(k, style="dim"), t(v, style.get(k, ""))) for k, v in lines], width)
