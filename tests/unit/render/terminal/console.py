"""A plain console that writes to a string, ``width`` cells wide (no colour, no markup)."""

from __future__ import annotations

import io

from rich.console import Console, RenderableType


def text_of(renderable: RenderableType | None, width: int = 100) -> str:
    buf = io.StringIO()
    if renderable is not None:
        Console(file=buf, width=width, color_system=None, markup=False, emoji=False, highlight=False).print(
            renderable
        )
    return buf.getvalue()
