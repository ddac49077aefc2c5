"""Fitting text into terminal columns: names shortened in the middle (the distinguishing tail
stays), numbers never cut, column widths shared out so a table fits the console's width."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.cells import cell_len, get_character_cell_size
from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from ..rows import cut_middle

ELLIPSIS = "…"
MARKER = re.compile(r"^(step|∇|#\d+) ")  # a row's kind before its name, kept when the name is shortened
SEP = 1  # cells between columns


def _head(s: str, cells: int) -> str:
    """The longest prefix of ``s`` at most ``cells`` wide."""
    out, used = [], 0
    for ch in s:
        used += get_character_cell_size(ch)
        if used > cells:
            break
        out.append(ch)
    return "".join(out)


def shorten_middle(name: str, width: int, sep: str = ".") -> str:
    """``name`` in at most ``width`` cells, shortened in the middle as every view shortens it
    (``rows.cut_middle``: whole components go, the layer index and the leaf stay:
    ``model.layers.11.…output_projection_layer``); a row's marker (``step``, ``∇``, ``#3``) stays
    in front."""

    if cell_len(name) <= width:
        return name
    if width <= 1:
        return ELLIPSIS[: max(0, width)]
    marker = MARKER.match(name)
    if (
        marker and width - cell_len(marker[0]) >= 8
    ):  # "step lm_head.weight", "∇ fc1", "#3 mlp": the marker stays
        return marker[0] + shorten_middle(name[marker.end() :], width - cell_len(marker[0]), sep)
    return cut_middle(name, width, sep)


def shorten_end(s: str, width: int) -> str:
    """``s`` in at most ``width`` cells, cut at the end (class names: the start says what it is)."""
    if cell_len(s) <= width:
        return s
    return _head(s, max(0, width - 1)) + ELLIPSIS if width > 0 else ""


def _words(para: str) -> list[tuple[str, str]]:
    """(word, the spaces after it) pairs; a bracketed group such as an index "[5, 1]" is one word."""
    parts = re.split(r"( +)", para)
    out: list[tuple[str, str]] = []
    word, depth = "", 0
    for k, p in enumerate(parts):
        if k % 2 == 0:
            word += p
            depth += p.count("[") - p.count("]")
        elif depth > 0:
            word += p
        else:
            out.append((word, p))
            word, depth = "", 0
    return out + [(word, "")]


def wrap(s: str, width: int) -> list[str]:
    """``s`` as lines of at most ``width`` cells, broken at spaces (kept as they are inside a
    line) but never inside a number or a bracketed index; a dotted name or path wider than the
    whole line is shortened in the middle (``shorten_middle``), any other such word is cut."""
    lines: list[str] = []
    for para in s.split("\n"):
        line, gap = "", ""
        for word, spaces in _words(para):
            if line and cell_len(line + gap + word) > width:
                lines.append(line)
                line, gap = "", ""
            sep = "/" if "/" in word else "." if "." in word.strip(".,;:") else None
            if cell_len(word) > width > 0 and sep:  # a module name or path: shortened in the middle, not cut
                word = shorten_middle(word, width, sep)
            while cell_len(word) > width > 0:
                lines.append(_head(word, width))
                word = word[len(lines[-1]) :]
            line, gap = line + gap + word, spaces
        lines.append(line)
    return lines


def hanging(rows: Sequence[tuple[Text, Text]], width: int) -> Table:
    """Label/value lines in ``width`` cells; a long value wraps with its continuation lines
    indented under the value's first character."""
    label_w = max((label.cell_len for label, _ in rows), default=0)
    value_w = max(8, width - label_w - SEP)
    values = [Text("\n".join(wrap(value.plain, value_w)), style=value.style) for _, value in rows]
    grid = Table.grid(padding=(0, SEP, 0, 0))
    grid.add_column(no_wrap=True, width=label_w)
    grid.add_column(
        no_wrap=True,
        width=max((cell_len(x) for v in values for x in v.plain.split("\n")), default=1),
        overflow="crop",
    )
    for (label, _), value in zip(rows, values):
        grid.add_row(label, value)
    return grid


@dataclass
class Col:
    """A column to fit. ``fixed``: never cut or wrapped (numbers); ``name``: shortened in the
    middle; ``end``: shortened at the end; ``text``: wrapped on words; ``bar``: drawn to width.
    ``low`` is the narrowest a flexible column goes before the table drops ``optional`` columns."""

    header: str
    cells: list[Text]
    kind: str = "fixed"
    low: int = 0
    cap: int | None = None
    justify: JustifyMethod = "left"
    optional: bool = False
    draw: Callable[[int, int], Text] | None = None  # bar: (row, width) → the drawn cell

    @property
    def natural(self) -> int:
        if self.kind == "bar":
            return self.cap or self.low
        nat = max([cell_len(self.header), *(c.cell_len for c in self.cells)])
        return min(nat, self.cap) if self.cap is not None else nat


def fit(cols: Sequence[Col], total: int, order: Sequence[tuple[int, int | None]] = ()) -> list[int]:
    """Column widths summing, with separators, to at most ``total``: fixed columns get their
    natural width, flexible ones ``low``, then the rest is handed out in ``order`` — (column, up
    to this width; None: its natural width) — and finally to every flexible column left to right.
    An ``optional`` column (width 0 while hidden) is shown at its stage when ``low`` cells are left."""
    widths = [c.natural if c.kind == "fixed" else min(c.natural, c.low) for c in cols]
    shown = [not c.optional for c in cols]

    def spare() -> int:
        return total - sum(w for w, s in zip(widths, shown) if s) - SEP * (sum(shown) - 1)

    stages = [*order, *((i, None) for i, c in enumerate(cols) if c.kind != "fixed")]
    for i, cap in stages:
        if not shown[i] and spare() >= widths[i] + SEP:
            shown[i] = True
        if shown[i]:
            target = cols[i].natural if cap is None else min(cap, cols[i].natural)
            widths[i] += max(0, min(spare(), target - widths[i]))
    return [w if s else 0 for w, s in zip(widths, shown)]


def _cell(c: Col, row: int, width: int) -> Text:
    if c.draw is not None:
        return c.draw(row, width)
    t = c.cells[row]
    if c.kind == "name":
        return Text(shorten_middle(t.plain, width), style=t.style)
    if c.kind == "end":
        return Text(shorten_end(t.plain, width), style=t.style)
    return t


def table(
    cols: Sequence[Col], total: int, order: Sequence[tuple[int, int | None]] = (), title: str | None = None
) -> Table:
    """A borderless rich table of ``cols`` fitted to ``total`` cells."""
    widths = fit(cols, total, order)
    tab = Table(
        box=None,
        header_style="dim",
        pad_edge=False,
        padding=(0, SEP, 0, 0),
        show_edge=False,
        title=Text(title, style="bold") if title else None,
        title_justify="left",
    )
    keep = [i for i, w in enumerate(widths) if w > 0]
    for i in keep:
        c = cols[i]
        tab.add_column(
            Text(shorten_end(c.header, widths[i])),
            width=widths[i],
            justify=c.justify,
            no_wrap=c.kind != "text",
            overflow="fold" if c.kind == "text" else "crop",
        )
    for r in range(len(cols[0].cells) if cols else 0):
        tab.add_row(*(_cell(cols[i], r, widths[i]) for i in keep))
    return tab
