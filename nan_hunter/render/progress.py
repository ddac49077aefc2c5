"""Rich progress displays on stderr: a bar for long weights scans (only shown after the first
second) and a status line while bisect searches. Tensor names are escaped and never read as
markup."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from .escape import terminal
from .terminal.layout import shorten_middle


class ScanProgress:
    def __init__(self, delay: float = 1.0) -> None:
        self.start = time.monotonic()
        self.delay = delay
        self.bar: Progress | None = None
        self.task = None
        self.done = 0

    def update(self, name: str, nbytes: int, total: int | None = None) -> None:
        self.done += nbytes
        if self.bar is None:
            if time.monotonic() - self.start < self.delay:
                return
            self.bar = Progress(TextColumn("scanning weights"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TextColumn("{task.fields[name]}", markup=False),
                                console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("scan", total=total, name="")
        self.bar.update(self.task, completed=self.done, name=shorten_middle(terminal(name), 40))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class BisectProgress:
    """A live status line while bisect searches (runs so far and the last verdict)."""

    def __init__(self) -> None:
        from rich.status import Status

        self.status = Status("bisect: preparing", console=Console(stderr=True))
        self.status.start()

    def update(self, runs: int, what: str) -> None:
        self.status.update(f"bisect: run {runs} · {what}")

    def close(self) -> None:
        self.status.stop()
