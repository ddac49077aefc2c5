"""``--report PATH``: an HTML page, or Markdown with its plots as PNGs beside it, chosen by the
suffix. ``render_report`` builds the files' contents; ``write_report`` only writes them."""

from __future__ import annotations

from pathlib import Path

from ..outputs import MARKDOWN_SUFFIXES, check_report_suffix, markdown_pngs, write_bytes
from ..report import Report
from .html import render_html
from .markdown import render_markdown
from .plot import plot_or_note


def render_report(reps: Report | list[Report], path: str) -> tuple[list[tuple[str, bytes]], list[str]]:
    """(files to write: ``(path, content)`` with the report itself first, notes for the user —
    a missing matplotlib costs the plot and says so once)."""

    reps = [reps] if isinstance(reps, Report) else reps
    plots = [plot_or_note(r) for r in reps]
    notes = list(dict.fromkeys(why for png, why in plots if png is None and why and "matplotlib" in why))
    if Path(path).suffix.lower() not in MARKDOWN_SUFFIXES:
        return [(path, render_html(reps, plots).encode("utf-8"))], notes

    pngs = markdown_pngs(path, len(reps))
    text = render_markdown(reps, [(Path(p).name if png else None, why) for (png, why), p in zip(plots, pngs)])
    return [(path, text.encode("utf-8"))] + [(p, png) for (png, _), p in zip(plots, pngs) if png], notes


def write_report(reps: Report | list[Report], path: str) -> list[str]:
    """Render and write ``path`` (and its PNGs), each file atomically; returns notes for the user."""

    check_report_suffix(path)
    files, notes = render_report(reps, path)
    for p, data in reversed(files):  # the PNGs first: the report never links a file not yet there
        write_bytes("--report", p, data)
    return notes
