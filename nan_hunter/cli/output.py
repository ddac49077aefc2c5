"""What commands print and write: output checks before the work, the JSON report, the terminal
view (on stderr when an output takes stdout), ``--report`` files and progress bars."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import outputs
from ..outputs import Output, check_outputs, report_outputs

if TYPE_CHECKING:  # pragma: no cover
    from ..outputs import Output


def say(msg: str) -> None:
    sys.stderr.write(f"nanhunter: {msg}\n")


#: the files this command wrote, as (flag, path), said on stderr when it ends (``announce_written``)
WRITTEN: list[tuple[str, str]] = []


def collect_written(quiet: bool) -> None:
    """From now on, remember every file written (``outputs.on_written``) to announce it when the
    command ends — after its terminal view, so the view is not cut by them; ``--quiet``: no."""

    WRITTEN.clear()
    outputs.on_written(None if quiet else lambda flag, path: WRITTEN.append((flag, path)))


def wrote(flag: str, path: str) -> None:
    """A file written other than through ``outputs`` (the ``--trace`` stream), announced with the rest."""

    if outputs._written_listener is not None:
        outputs._written_listener(flag, path)


def was_written(flag: str) -> bool:
    return any(f == flag for f, _ in WRITTEN)


def announce_written() -> None:
    """``nanhunter: wrote r.html (--report)``, one line per file written, then forget them."""

    outputs.on_written(None)
    for flag, path in WRITTEN:
        say(f"wrote {path} ({flag})")
    WRITTEN.clear()


def planned_outputs(args: Any, flags: Iterable[tuple[str, str]], n_reports: int = 1) -> list[Output]:
    """The outputs a command's flags ask for: ``flags`` maps attribute names to flags
    (``("json", "--json")``); ``--report`` adds its page and PNGs."""

    outs = [
        Output(flag, getattr(args, attr)) for attr, flag in flags if getattr(args, attr, None) is not None
    ]
    return outs + report_outputs(getattr(args, "report", None), n_reports)


def check_command_outputs(outs: list[Output], args: Any, checkpoints: list[str]) -> bool:
    """Refuse bad outputs before any work (exit 2); True when one of them takes stdout."""
    from ..load.command_inputs import input_files  # lazy: --help stays light

    check_outputs(outs, input_files(checkpoints, args.inputs, args.data, args.config, args.arch))
    return any(o.to_stdout for o in outs)


def scan_progress():
    """A rich progress bar for the weights scan, shown only on a terminal: (bar, callback)."""
    if not sys.stderr.isatty():
        return None, None
    from ..render.progress import ScanProgress  # lazy: rich, after parsing

    p = ScanProgress()
    return p, p.update


def stage_progress(quiet: bool = False):
    """The stage display on stderr (``render.progress.StageProgress``), or None when stderr is
    not a terminal or with --quiet."""
    if quiet or not sys.stderr.isatty():
        return None
    from ..render.progress import StageProgress  # lazy: rich, after parsing

    return StageProgress()


def write_report_file(reps: Any, path: str | None, quiet: bool = False) -> None:
    """``--report``: HTML or Markdown by suffix; a missing matplotlib costs the plot and one line
    (none with ``--quiet``: the report itself says it)."""
    if not path:
        return
    from ..render.report_file import write_report  # lazy: --help stays light

    for note in write_report(reps, path):
        if not quiet:
            say(note)


def write_json(reps: Any, path: str | None) -> None:
    if path is not None:
        from ..report import write_json as _write  # lazy: --help stays light

        _write(reps, path)


def terminal_limits(cfg: Any) -> dict[str, Any]:
    """The terminal renderer's limits from the configuration (keyword arguments of ``render``)."""
    return {
        "near_miss_max_listed": cfg.near_miss.max_listed,
        "weights_max_rows": cfg.weights.max_rows,
        "weights_targets": cfg.weights.targets,
    }
