"""``nanhunter``: the entry point. Runs one command of the typer application (``app``) and turns
what ends it into an exit code: bad usage or bad input → one line and 2; Ctrl-C → 130; an
internal error → one line and 3."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from ..errors import BadInput
from ..outputs import stdout_closed
from . import interrupts
from .output import announce_written
from .usage import click_exceptions, usage_line


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns its exit code (raises BadInput/KeyboardInterrupt).
    Usage errors are one line on stderr and 2; no command at all prints the help on stderr and 2."""
    import typer

    from . import options  # lazy: typer, loaded when main() runs
    from .app import COMPLETE_VAR, PROG, build_command  # lazy: typer, loaded when main() runs

    args = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    options.COMMAND_LINE = ["nanhunter", *args]  # run.command in the report
    cmd = build_command()
    cmd._main_shell_completion({}, PROG, COMPLETE_VAR)  # exits when the shell asks for completions
    if not args:
        return _help_on_stderr(cmd)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    quiet_libraries()
    exc = click_exceptions()
    options.STARTED = False
    try:
        with cmd.make_context(PROG, args) as ctx:
            try:
                code = cmd.invoke(ctx)
            finally:
                announce_written()  # every file written, also when a later step failed
    except typer.Exit as e:  # --help, --version
        return int(getattr(e, "exit_code", 0) or 0)
    except exc.UsageError as e:
        if str(getattr(e, "message", "")).startswith("Missing command"):
            return _help_on_stderr(cmd)
        sys.stderr.write(usage_line(e, args) + "\n")
        return 2
    except BrokenPipeError:
        if options.STARTED:  # a command's own output: its writers handle a closed stdout
            raise

        stdout_closed()  # `nanhunter --help | head -1`
        return 0
    except SystemExit as e:
        if options.STARTED or e.code != 1 or not _stdout_is_devnull():
            raise
        return 0  # rich met the closed pipe while printing the help, pointed stdout at /dev/null and exited 1
    return int(code or 0)


def _stdout_is_devnull() -> bool:
    try:
        return os.path.samestat(os.fstat(sys.stdout.fileno()), os.stat(os.devnull))
    except (OSError, ValueError, AttributeError):
        return False


def _help_on_stderr(cmd: Any) -> int:
    import contextlib

    import typer

    with contextlib.redirect_stdout(sys.stderr):
        try:
            cmd.make_context("nanhunter", ["--help"])
        except typer.Exit:
            pass
    return 2


#: Loggers of libraries the model code imports, whose import-time warnings are not the user's
#: business and would break "one line on stderr" (torchao's missing CUDA extensions; torch's
#: deprecation notice for torchao's pytree registrations).
NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


def quiet_libraries() -> None:
    import logging

    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def run(argv: list[str] | None = None) -> None:
    """Console-script entry point: never a traceback for the user (NANHUNTER_DEBUG=1 shows it).
    Ends the process (``main`` is the in-process form)."""
    interrupts.install()
    try:
        code = main(argv)
    except BadInput as e:
        sys.stderr.write(f"nanhunter: error: {e}\n")
        code = 2
    except KeyboardInterrupt:
        interrupts.report_interrupt()
        code = interrupts.EXIT_CODE
    except Exception as e:
        if os.environ.get("NANHUNTER_DEBUG"):
            raise
        sys.stderr.write(
            f"nanhunter: internal error: {type(e).__name__}: {e} "
            "(set NANHUNTER_DEBUG=1 for the traceback and report it)\n"
        )
        code = 3
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """Flush and exit. Once torch is loaded, tearing the interpreter down (module teardown, a
    garbage collection of every torch object) takes 0.3-0.9 s on a 2-core machine, longer than
    scanning a 4 GB checkpoint: the atexit handlers still run (logging, temporary directories,
    coverage), then the process ends without the teardown. Outputs were fsynced when written."""
    _flush_or_discard()
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    if "torch" in sys.modules:
        import atexit

        atexit._run_exitfuncs()
        _flush_or_discard()
        os._exit(code)
    sys.exit(code)


def _flush_or_discard() -> None:
    """Flush stdout; if the reader has gone (``nanhunter ... --json - | head``), drop what is left
    instead of a BrokenPipeError message at exit."""
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        stdout_closed()


if __name__ == "__main__":  # pragma: no cover
    run()
