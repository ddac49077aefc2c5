"""The examples section under a command's ``--help`` (the rest of the help is typer's own rich
rendering): each example's purpose, then the command line exactly as typed."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.text import Text


def examples_text(examples: list[tuple[str, str]]) -> Text:
    out = Text()
    for i, (what, cmd) in enumerate(examples):
        if i:
            out.append("\n")
        out.append(f"# {what}\n", style="dim")
        out.append(cmd + "\n", style="bold")
    out.rstrip()
    return out


def print_examples(examples: list[tuple[str, str]], console: Console | None = None) -> None:
    """Print ``examples`` (what, command line) as a panel titled Examples, as wide as typer's help
    (the terminal's width, or ``COLUMNS``)."""
    c = console or Console(highlight=False)
    c.print(Panel(examples_text(examples), title="Examples", title_align="left", border_style="dim"))
