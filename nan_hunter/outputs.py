"""Output files: checked before any work, written atomically, never onto an input.

The only place that validates output paths and writes output files (``--json``, ``--policy-out``,
``--junit``, ``--report`` and the PNGs beside a Markdown report). Checks run before the command
does any work: an output may not be an input (the checkpoint, its shards or index, an
``--inputs``/``--data``/``--config``/``--arch`` file — compared after resolving symlinks, and by
``st_dev``/``st_ino`` so hard links count), a directory, or the same file as another output;
``-`` is stdout, for one text output at most. Writes go to a temporary file in the target's
directory, are flushed and fsynced, then renamed over the target: a failure (a full disk, a
file-size limit, Ctrl-C) leaves the temporary removed and nothing new at the target.

A reader of stdout that goes away (``nanhunter scan X | head -1``) ends what goes to stdout, not
the command: the rest of that output is dropped (``stdout_closed``), the other outputs are still
written, and the exit code stays the verdict's (exit 1 only means a non-finite value was found).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInput

STDOUT = "-"
REPORT_SUFFIXES = (".html", ".htm", ".md", ".markdown")
MARKDOWN_SUFFIXES = (".md", ".markdown")
_TMP_SUFFIX = ".nanhunter-tmp"

# Temporary files being written right now; an interrupt handler removes them (``remove_temporaries``).
_temporaries: set[str] = set()

#: Told of each file written, as ``(flag, path)``, once it is in place (``on_written``): the CLI
#: announces every file it wrote; a library caller hears nothing unless it asks.
_written_listener: Callable[[str, str], None] | None = None


def on_written(listener: Callable[[str, str], None] | None) -> None:
    """Call ``listener(flag, path)`` for each file written from now on (None: nobody). Capsule files
    are not told one by one: a capsule is announced whole by the watch that writes it."""
    global _written_listener
    _written_listener = listener


@dataclass(frozen=True)
class Output:
    """One output the user asked for: its flag (for messages), its path as given, and whether it
    is text that may go to stdout (``-``)."""

    flag: str
    path: str
    text: bool = True

    @property
    def to_stdout(self) -> bool:
        return self.path == STDOUT


# --- checking ------------------------------------------------------------------------------------
def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def real_path(path: str) -> Path:
    """The path with every symlink resolved (also a dangling one: the file it would create)."""
    return Path(os.path.realpath(path))


def markdown_pngs(path: str, n_reports: int) -> list[str]:
    """The PNGs a Markdown report writes beside itself: ``r.md`` → ``r.png``; several reports →
    ``r-1.png``, ``r-2.png``, ..."""
    p = Path(path)
    if n_reports <= 1:
        return [str(p.with_suffix(".png"))]
    return [str(p.with_name(f"{p.stem}-{i + 1}.png")) for i in range(n_reports)]


def report_outputs(path: str | None, n_reports: int = 1) -> list[Output]:
    """``--report PATH``: the page itself and, for Markdown, its PNGs (all checked like outputs)."""
    if path is None:
        return []
    check_report_suffix(path)
    outs = [Output("--report", path, text=False)]
    if Path(path).suffix.lower() in MARKDOWN_SUFFIXES:
        outs += [Output("--report", png, text=False) for png in markdown_pngs(path, n_reports)]
    return outs


def check_report_suffix(path: str) -> None:
    if Path(path).suffix.lower() not in REPORT_SUFFIXES:
        raise BadInput(
            f"--report {path}: use a name ending in .html (self-contained page) or .md (Markdown + PNG)"
        )


def _check_one(out: Output) -> None:
    path = out.path
    if path == STDOUT:
        if not out.text:
            raise BadInput(f"{out.flag} -: this output cannot go to stdout; give a file name")
        return
    if not path or "\0" in path:
        raise BadInput(f"{out.flag} {path!r}: not a usable file name")
    if path == os.devnull:
        return
    real = real_path(path)
    if real.is_dir():
        raise BadInput(
            f"{out.flag} {path}: is a directory; give a file path such as {Path(path) / 'nanhunter.out'}"
        )
    if real.exists() and not real.is_file():
        raise BadInput(f"{out.flag} {path}: not a regular file (a FIFO, socket or device); give a file path")
    parent = real.parent
    if not parent.is_dir():
        raise BadInput(
            f"{out.flag} {path}: directory {Path(path).parent} does not exist; create it or pick another path"
        )


def check_outputs(outputs: Iterable[Output | None], inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Refuse (BadInput, exit 2) before any work: an output that is an input, a directory, not a
    regular file, in a missing directory, the same file as another output, or a second ``-``."""
    outs = [o for o in outputs if o is not None]
    to_stdout = [o for o in outs if o.to_stdout]
    if len(to_stdout) > 1:
        flags = " and ".join(f"{o.flag} -" for o in to_stdout)
        raise BadInput(f"{flags}: only one output can go to stdout; write the others to files")
    for o in outs:
        _check_one(o)
    protected: dict[Path, str] = {}
    protected_ids: dict[tuple[int, int], str] = {}
    for f in inputs:
        p = Path(f)
        r = real_path(str(p))
        protected[r] = str(p)
        ident = _identity(r)
        if ident is not None:
            protected_ids[ident] = str(p)
    seen: dict[Path, Output] = {}
    seen_ids: dict[tuple[int, int], Output] = {}
    for o in outs:
        if o.to_stdout or o.path == os.devnull:
            continue
        r = real_path(o.path)
        ident = _identity(r)
        hit = protected.get(r) or (protected_ids.get(ident) if ident is not None else None)
        if hit is not None:
            raise BadInput(
                f"{o.flag} {o.path}: is an input of this command ({hit}); nanhunter never writes to "
                "its inputs: pick another path"
            )
        other = seen.get(r) or (seen_ids.get(ident) if ident is not None else None)
        if other is not None:
            raise BadInput(
                f"{o.flag} {o.path}: is the same file as {other.flag} {other.path}; give each output "
                "its own path"
            )
        seen[r] = o
        if ident is not None:
            seen_ids[ident] = o


# --- writing -------------------------------------------------------------------------------------
def _mode_for(target: Path) -> int:
    """Keep an existing file's permission bits; a new file gets 0666 less the umask, as open() would."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def write_bytes(flag: str, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (``-``: stdout). A failure raises BadInput naming the
    output and the reason, with the temporary file removed and the target untouched."""
    if path == STDOUT:
        try:
            sys.stdout.flush()
            buf = getattr(sys.stdout, "buffer", None)  # absent when stdout was replaced by a text stream
            if buf is not None:
                buf.write(data)
                buf.flush()
            else:
                sys.stdout.write(data.decode("utf-8"))
            sys.stdout.flush()
        except BrokenPipeError:
            stdout_closed()  # the reader went away: not the user's input, not a finding
        except OSError as e:
            raise BadInput(f"{flag} -: cannot write to stdout ({e.strerror or e})") from None
        return
    if path == os.devnull:
        with open(path, "wb") as f:
            f.write(data)
        return
    target = real_path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=_TMP_SUFFIX, dir=target.parent)
    except OSError as e:
        raise BadInput(f"{flag} {path}: cannot write ({e.strerror or e}); nothing was written") from None
    _temporaries.add(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
    except BaseException as e:
        _remove(tmp)
        if isinstance(e, OSError):
            raise BadInput(f"{flag} {path}: cannot write ({e.strerror or e}); nothing was written") from None
        raise
    finally:
        _temporaries.discard(tmp)
    _sync_dir(target.parent)
    if _written_listener is not None and flag != "capsule":
        _written_listener(flag, path)


def write_text(flag: str, path: str, text: str) -> None:
    """``write_bytes`` for text (UTF-8)."""
    write_bytes(flag, path, text.encode("utf-8"))


def _sync_dir(d: Path) -> None:
    """Make the rename itself durable (best effort: not every filesystem allows it)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def remove_temporaries() -> None:
    """Remove every temporary file still being written (called when the process is interrupted)."""
    for tmp in list(_temporaries):
        _remove(tmp)
        _temporaries.discard(tmp)


def stdout_closed() -> None:
    """The reader of stdout has gone (``| head``): point file descriptor 1 at the null device, so
    that every later write to stdout (the rest of the terminal view, a buffered line, the
    interpreter's final flush) is dropped instead of raising ``BrokenPipeError`` again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor behind sys.stdout (a test's capture)
        pass
    finally:
        os.close(devnull)
