"""``nanhunter``: the entry point. Builds the parser, runs one command, and turns what ends it
into an exit code: bad input → one line and 2; Ctrl-C → 130; an internal error → one line and 3."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from ..errors import BadInput
from ..version import __version__
from . import bisect_cmd, check_cmd, diff_cmd, interrupts, scan_cmd
from .options import Parser

DESCRIPTION = "Find the first module and aten op that produced NaN/Inf, and how to fix it."


def build_parser() -> Parser:
    p = Parser(prog="nanhunter", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"nanhunter {__version__}", help="print the version and exit")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")
    for cmd in (scan_cmd, bisect_cmd, check_cmd, diff_cmd):
        cmd.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns its exit code (raises BadInput/KeyboardInterrupt)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = ["nanhunter", *(sys.argv[1:] if argv is None else argv)]  # run.command in the report
    command = getattr(args, "command", None)
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    quiet_libraries()
    return command(args)


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
        sys.stderr.write(f"nanhunter: internal error: {type(e).__name__}: {e} "
                         "(set NANHUNTER_DEBUG=1 for the traceback and report it)\n")
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
        from ..outputs import stdout_closed

        stdout_closed()


if __name__ == "__main__":  # pragma: no cover
    run()
