"""Stage progress, as a protocol the pipeline calls and a view implements.

The pipeline marks its stages (``with stage("capture"):``, ``advance()`` inside a counted one);
whoever runs it installs a reporter with ``using(reporter)`` — the CLI a rich display on stderr
(``render/progress.StageProgress``), shown only for stages that last more than a second. With
none installed every call is a no-op, so library use stays silent and costs nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Protocol


class Progress(Protocol):
    """What a progress reporter implements."""

    def start(self, stage: str, total: int | None = None) -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def done(self) -> None: ...


class NoProgress:
    """The default: nothing shown."""

    def start(self, stage: str, total: int | None = None) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def done(self) -> None:
        pass


_NONE = NoProgress()
_CURRENT: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("nanhunter_progress", default=None)

#: the stages the pipeline reports, in the words the display shows
STAGES = {
    "load": "loading the model",
    "weights": "scanning weights",
    "capture": "running the model under capture",
    "locate": "locating the op",
    "replay": "replaying the failing region per dtype",
    "fix": "verifying the fix on a copy",
    "compile": "compiling and comparing with eager",
    "decode": "decoding",
    "bisect": "bisect runs",
}


def current() -> Progress:
    return _CURRENT.get() or _NONE


@contextlib.contextmanager
def using(reporter: Progress | None) -> Iterator[None]:
    """Install ``reporter`` (None: keep the current one) for the calls inside."""
    if reporter is None:
        yield
        return
    token = _CURRENT.set(reporter)
    try:
        yield
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def stage(name: str, total: int | None = None) -> Iterator[None]:
    """One stage: started on entry, done on exit (also on an exception)."""
    p = current()
    p.start(name, total)
    try:
        yield
    finally:
        p.done()


def advance(n: int = 1) -> None:
    current().advance(n)
