"""Ctrl-C: exit 130 within a second, with temporary output files removed.

SIGINT raises ``KeyboardInterrupt`` in the main thread as usual; the command unwinds and
``main.run`` exits 130. Python runs that handler only between bytecodes, so a main thread stuck
in native code (or user code that swallows ``KeyboardInterrupt``) would ignore it: a watchdog
thread, woken through ``signal.set_wakeup_fd`` by the C-level handler itself, removes the
temporary files and ends the process with 130 if it is still alive ``GRACE_S`` later.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

GRACE_S = 0.6
EXIT_CODE = 130
MESSAGE = "nanhunter: interrupted\n"

_reported = threading.Event()


def report_interrupt() -> None:
    """Print the one line (once) and remove temporary files; the caller then exits 130."""
    if _reported.is_set():
        return
    _reported.set()
    _cleanup()
    try:
        sys.stderr.write(MESSAGE)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _cleanup() -> None:
    mod = sys.modules.get("nan_hunter.outputs")  # nothing to remove if no output was ever written
    if mod is not None:
        mod.remove_temporaries()


def _watchdog(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            threading.Event().wait(GRACE_S)
            if not _reported.is_set():
                _reported.set()
                _cleanup()
                try:
                    os.write(2, MESSAGE.encode())
                except OSError:
                    pass
            os._exit(EXIT_CODE)


def install() -> None:
    """Arm the watchdog (main thread only; a no-op elsewhere, e.g. under a test runner's thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # someone else (an embedding program) owns Ctrl-C
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:
        os.close(r)
        os.close(w)
        return
    threading.Thread(target=_watchdog, args=(r,), name="nanhunter-sigint", daemon=True).start()
