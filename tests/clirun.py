"""The one way tests run the real ``nanhunter`` command (``run_cli``) and the paths they share.

A plain module, not ``conftest``: test files import it by name (``from clirun import run_cli``),
which a ``conftest`` import cannot do safely (pytest loads several ``conftest`` modules, and the
one a bare ``import conftest`` finds depends on which folders were collected first).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"



@dataclass
class CLIRun:
    """What one run of the real ``nanhunter`` command gave; unpacks as ``code, stdout, stderr``."""

    code: int
    stdout: str
    stderr: str
    interrupt_s: float | None = None  # seconds from SIGINT to exit, when the run was interrupted

    def __iter__(self):
        return iter((self.code, self.stdout, self.stderr))


def cli_command(*args: object) -> list[str]:
    """The argv of the real command (``python -m nan_hunter``: the venv's interpreter, no PATH lookup)."""
    return [sys.executable, "-m", "nan_hunter", *map(str, args)]


#: variables of the calling shell that change what the command prints: the CI flag, and the ones
#: that make rich colour a pipe (``FORCE_COLOR``, ``TTY_COMPATIBLE``...), so that no capture depends
#: on the terminal the suite was started from
OUTSIDE_ENV = ("GITHUB_ACTIONS", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE", "LINES")


def cli_env(env: dict | None = None) -> dict[str, str]:
    """Offline, a wide terminal, and ``OUTSIDE_ENV`` cleared (set GITHUB_ACTIONS in ``env`` to test
    annotations), so the suite behaves the same inside and outside Actions and whatever the calling
    terminal. A value of None removes a variable."""
    e = {k: v for k, v in os.environ.items() if k not in OUTSIDE_ENV}
    e.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="160", PYTHONDONTWRITEBYTECODE="1")
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = str(v)
    return e


def run_cli(*args: object, stdin: str | None = None, env: dict | None = None, timeout: float = 300,
            cwd: str | os.PathLike | None = None, preexec_fn=None, interrupt_when: Path | None = None,
            reader_leaves_after: int | None = None) -> CLIRun:
    """The one way tests run ``nanhunter``: a real subprocess; returns (code, stdout, stderr).

    ``interrupt_when``: once that file exists, send SIGINT and time how long the process takes
    to exit (``CLIRun.interrupt_s``). ``preexec_fn`` runs in the child before exec (resource limits).
    ``reader_leaves_after``: stdout is a pipe whose reader closes it after that many lines (0: at
    once, before the command writes anything), as ``nanhunter ... | head -1`` does; stdout is then
    what was read.
    """
    if reader_leaves_after is not None:
        return _run_cli_reader_leaves(args, reader_leaves_after, env, timeout, cwd)
    proc = subprocess.Popen(cli_command(*args), stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(env),
                            cwd=cwd or ROOT, preexec_fn=preexec_fn)
    took = None
    try:
        if interrupt_when is not None:
            deadline = time.monotonic() + timeout
            while not Path(interrupt_when).exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    out, err = proc.communicate()
                    raise AssertionError(f"{interrupt_when} never appeared (exit {proc.returncode}): {err[-2000:]}")
                time.sleep(0.02)
            sent = time.monotonic()
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=timeout)
            took = time.monotonic() - sent
        else:
            out, err = proc.communicate(stdin, timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return CLIRun(proc.returncode, out, err, took)


def _run_cli_reader_leaves(args: tuple, lines: int, env: dict | None, timeout: float,
                          cwd: str | os.PathLike | None) -> CLIRun:
    proc = subprocess.Popen(cli_command(*args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=cli_env(env), cwd=cwd or ROOT)
    try:
        read = b"".join(proc.stdout.readline() for _ in range(lines))
        proc.stdout.close()  # the reader is gone: every later write to the pipe fails
        err = proc.stderr.read()
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return CLIRun(proc.returncode, read.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
