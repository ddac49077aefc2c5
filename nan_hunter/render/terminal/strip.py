"""The headroom strip in the terminal: one line per module call, a bar of log10(absmax)
climbing towards the run's largest finite value, coloured by how much headroom is left. Widths
follow the console: numbers whole, names shortened in the middle, the bar between 10 and 28
cells."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from ...report import Report
from ..escape import terminal as esc
from ..headroom import STRIP_ROWS, StripCall, strip
from .layout import SEP, Col, fit, shorten_end, shorten_middle, wrap

BAR_MIN, BAR_MID, BAR_MAX = 10, 20, 28
NAME_MID = 36  # the module column grows to this before the bar does
TONE = {"bad": "bold red", "tight": "red", "close": "yellow", "ok": "green", "empty": "dim"}


def _bar(it: StripCall, width: int) -> Text:
    if it.tone == "empty":
        return Text("·" * width, style="dim")
    n = width if it.tone == "bad" else max(1, round(it.fill * width))
    return Text("█" * n, style=TONE[it.tone]) + Text("·" * (width - n), style="dim")


def _name(it: StripCall, indent: int) -> str:
    prefix = f"#{it.input_index} " if it.input_index is not None else ""
    return " " * (indent * min(it.depth, 6)) + prefix + esc(it.module)


def headroom_strip(rep: Report, width: int, max_rows: int = STRIP_ROWS) -> Group | None:
    """The strip for a console ``width`` cells wide; None when the report has no module rows."""
    s = strip(rep, max_rows)
    if s is None:
        return None
    calls = [it for it in s.items if isinstance(it, StripCall)]
    head = f"log |out| → {s.dtype} max"
    cols = [
        Col("", [Text("▶")]),
        Col("module", [Text(_name(it, 2)) for it in calls], "name", low=24, cap=60),
        Col("type", [Text(esc(it.module_type)) for it in calls], "end", low=10, cap=22, optional=True),
        Col(head, [], "bar", low=BAR_MIN, cap=BAR_MAX),
        Col("abs-min", [Text(it.absmin) for it in calls], justify="right", optional=not s.has_absmin),
        Col("absmax", [Text(it.absmax) for it in calls], justify="right"),
        Col("headroom", [Text(it.headroom) for it in calls], justify="right"),
    ]
    order = [(1, NAME_MID), (3, BAR_MID), (2, 14), (1, None), (3, BAR_MAX)]
    flushes = any(it.flush not in ("0", "—") for it in calls)
    if flushes:  # else nothing flushes to zero (or nothing was measured): the column is left out
        cols.append(
            Col(f"→0 {s.flush_dtype}", [Text(it.flush) for it in calls], justify="right", optional=True)
        )
        order.insert(3, (len(cols) - 1, None))
    w = fit(cols, width, order=order)
    indent = 2 if w[1] >= 44 else 1

    def line(cells: list[Text]) -> Text:
        shown = []
        for i, (c, t) in enumerate(zip(cols, cells)):
            if w[i]:
                t.align("right" if c.justify == "right" else "left", w[i])
                shown.append(t)
        return Text(" " * SEP).join(shown)

    lines = [
        *(Text(part, style="bold") for part in wrap(s.title, width)),
        line(
            [
                Text(c.header if c.kind != "bar" else shorten_end(head, w[i]), style="dim")
                for i, c in enumerate(cols)
            ]
        ),
    ]
    for it in s.items:
        if not isinstance(it, StripCall):
            lines.append(Text(" " * (w[0] + SEP) + it.text, style="dim"))
            continue
        style = "bold red" if it.producer else "red" if it.tone == "bad" else ""
        name = _name(it, indent)
        body = len(name) - len(name.lstrip(" "))
        lines.append(
            line(
                [
                    Text("▶" if it.producer else "", style="bold red"),
                    Text(" " * body + shorten_middle(name[body:], w[1] - body), style=style),
                    Text(shorten_end(esc(it.module_type), w[2])),
                    _bar(it, w[3]),
                    Text(it.absmin, style="dim"),
                    Text(it.absmax, style=TONE["bad"] if it.tone == "bad" else ""),
                    Text(it.headroom),
                    *(
                        [Text(it.flush, style="yellow" if it.flush not in ("0", "—") else "dim")]
                        if flushes
                        else []
                    ),
                ]
            )
        )
    for t in lines:
        t.no_wrap, t.overflow = True, "crop"
    return Group(*lines)
