"""Rich progress displays on stderr: a bar for long weights scans (only shown after the first
second) and a status line while bisect searches. Tensor names are escaped and never read as
markup."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn

from ..progress import STAGES
from .escape import terminal
from .terminal.layout import shorten_middle

if TYPE_CHECKING:  # pragma: no cover
    from rich.status import Status


class ScanProgress:
    def __init__(self, delay: float = 1.0) -> None:
        self.start = time.monotonic()
        self.delay = delay
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        self.done = 0

    def update(self, name: str, nbytes: int, total: int | None = None) -> None:
        self.done += nbytes
        if self.bar is None:
            if time.monotonic() - self.start < self.delay:
                return
            self.bar = Progress(
                TextColumn("scanning weights"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TextColumn("{task.fields[name]}", markup=False),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("scan", total=total, name="")
        if self.task is not None:  # set with the bar
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


class StageProgress:
    """``progress.Progress`` on stderr: a spinner (and a count for counted stages) with
    the stage's name and elapsed time, shown only once a stage has lasted ``delay`` seconds and
    removed when it ends (transient), so fast runs print nothing extra."""

    def __init__(self, delay: float = 1.0, console: Console | None = None) -> None:
        import threading

        self.delay = delay
        self.console = console or Console(stderr=True)
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        self.status: Status | None = None
        self.name = ""
        self.total: int | None = None
        self.count = 0
        self.started = 0.0

    def _text(self) -> str:

        what = STAGES.get(self.name, self.name)
        count = f" {self.count}/{self.total}" if self.total else ""
        return f"{what}{count} · {time.monotonic() - self.started:.0f} s"

    def _show(self) -> None:
        from rich.status import Status

        with self.lock:
            if self.status is None and self.name:
                self.status = Status(self._text(), console=self.console)
                self.status.start()

    def start(self, stage: str, total: int | None = None) -> None:
        import threading

        self.done()
        with self.lock:
            self.name, self.total, self.count, self.started = stage, total, 0, time.monotonic()
            self.timer = threading.Timer(self.delay, self._show)
            self.timer.daemon = True
            self.timer.start()

    def advance(self, n: int = 1) -> None:
        with self.lock:
            self.count += n
            if self.status is not None:
                self.status.update(self._text())

    def done(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if self.status is not None:
                self.status.stop()
                self.status = None
            self.name = ""
