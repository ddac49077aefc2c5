"""Stage progress: a no-op by default; the rich display shows a stage only after its delay and
says nothing when stderr is not a terminal or with --quiet."""

from __future__ import annotations

import io
import time

from rich.console import Console

from nan_hunter.cli.output import stage_progress
from nan_hunter.progress import NoProgress, advance, current, stage, using
from nan_hunter.render.progress import StageProgress


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def start(self, name, total=None):
        self.events.append(("start", name, total))

    def advance(self, n=1):
        self.events.append(("advance", n))

    def done(self):
        self.events.append(("done",))


def test_default_is_silent_and_installed_reporters_see_stages():
    assert isinstance(current(), NoProgress)
    with stage("capture"):
        advance()  # nothing installed: nothing happens
    r = Recorder()
    with using(r):
        with stage("replay", total=5):
            advance(2)
    assert r.events == [("start", "replay", 5), ("advance", 2), ("done",)]
    assert isinstance(current(), NoProgress)


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=80), buf


def test_a_long_stage_is_shown_a_short_one_is_not():
    c, buf = _console()
    p = StageProgress(delay=0.05, console=c)
    p.start("load")
    p.done()  # under the delay: nothing
    assert buf.getvalue() == ""
    p.start("replay", total=3)
    time.sleep(0.3)
    p.advance()
    p.done()
    assert "replaying the failing region per dtype 1/3" in buf.getvalue()


def test_silent_off_a_terminal_or_quiet():
    assert stage_progress(quiet=True) is None
    assert stage_progress(quiet=False) is None  # pytest's stderr is not a terminal
