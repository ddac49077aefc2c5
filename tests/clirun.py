"""The two ways tests run the real ``nanhunter`` command and the paths they share.

``run_cli``: a real process (``python -m nan_hunter``), for what only a process shows — exit
codes through the console script, a traceback never printed, signals, resource limits, a closed
pipe, what ``--help`` imports. ``invoke``: the same entry point (``nan_hunter.cli.main``) in this
process, for what a command reports; the same environment rules, and the process-wide state a
command may change put back afterwards.

A plain module, not ``conftest``: test files import it by name (``from clirun import run_cli``),
which a ``conftest`` import cannot do safely (pytest loads several ``conftest`` modules, and the
one a bare ``import conftest`` finds depends on which folders were collected first).
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings
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
OUTSIDE_ENV = (
    "GITHUB_ACTIONS",
    "FORCE_COLOR",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "CLICOLOR_FORCE",
    "LINES",
    "PY_COLORS",
    "TERMINAL_WIDTH",
)


def cli_env(env: dict | None = None) -> dict[str, str]:
    """Offline, a wide terminal, and ``OUTSIDE_ENV`` cleared (set GITHUB_ACTIONS in ``env`` to test
    annotations), so the suite behaves the same inside and outside Actions and whatever the calling
    terminal. A value of None removes a variable."""
    e = {k: v for k, v in os.environ.items() if k not in OUTSIDE_ENV}
    e.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="160", PYTHONDONTWRITEBYTECODE="1")
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        elif k == "PYTHONPATH" and os.environ.get("PYTHONPATH"):
            # a test's path (a shim that hides a package) goes first; the caller's stays after it,
            # so the child imports the nanhunter under test, not another install of it
            e[k] = os.pathsep.join([str(v), os.environ["PYTHONPATH"]])
        else:
            e[k] = str(v)
    return e


def _sigint_default(then=None):
    """A ``preexec_fn`` that gives the child the default SIGINT, then runs ``then``."""

    def pre() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if then is not None:
            then()

    return pre


def run_cli(
    *args: object,
    stdin: str | None = None,
    env: dict | None = None,
    timeout: float = 300,
    cwd: str | os.PathLike | None = None,
    preexec_fn=None,
    interrupt_when: Path | None = None,
    reader_leaves_after: int | None = None,
) -> CLIRun:
    """The one way tests run ``nanhunter``: a real subprocess; returns (code, stdout, stderr).

    ``interrupt_when``: once that file exists, send SIGINT and time how long the process takes
    to exit (``CLIRun.interrupt_s``). ``preexec_fn`` runs in the child before exec (resource limits).
    ``reader_leaves_after``: stdout is a pipe whose reader closes it after that many lines (0: at
    once, before the command writes anything), as ``nanhunter ... | head -1`` does; stdout is then
    what was read.
    """
    if reader_leaves_after is not None:
        return _run_cli_reader_leaves(args, reader_leaves_after, env, timeout, cwd)
    if interrupt_when is not None:
        # Ctrl-C in a terminal meets a foreground process whose SIGINT is the default. A test run started
        # in the background (`cmd &`, nohup) hands its children SIGINT ignored, and Python keeps it so.
        preexec_fn = _sigint_default(preexec_fn)
    proc = subprocess.Popen(
        cli_command(*args),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(env),
        cwd=cwd or ROOT,
        preexec_fn=preexec_fn,
    )
    took = None
    try:
        if interrupt_when is not None:
            deadline = time.monotonic() + timeout
            while not Path(interrupt_when).exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    out, err = proc.communicate()
                    raise AssertionError(
                        f"{interrupt_when} never appeared (exit {proc.returncode}): {err[-2000:]}"
                    )
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


def _run_cli_reader_leaves(
    args: tuple, lines: int, env: dict | None, timeout: float, cwd: str | os.PathLike | None
) -> CLIRun:
    proc = subprocess.Popen(
        cli_command(*args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(env),
        cwd=cwd or ROOT,
    )
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


# --- in this process -----------------------------------------------------------------------------------
#: variables read once, when the interpreter or a library starts: setting them for one in-process
#: run would change nothing, so a test that needs one needs ``run_cli``
STARTUP_ONLY_ENV = (
    "PYTHONPATH",
    "PYTHONWARNINGS",
    "PYTHONHASHSEED",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "TRITON_INTERPRET",
)

#: loggers whose level a command sets (cli.main.NOISY_LOGGERS, model.build's library loggers,
#: transformers' verbosity): made to exist before the run, so that their level is put back too
_COMMAND_LOGGERS = (
    "torchao",
    "torch.utils._pytree",
    "accelerate",
    "transformers",
    "nan_hunter",
    "lightning.pytorch",
)


def invoke(
    *args: object,
    env: dict | None = None,
    cwd: str | os.PathLike | None = None,
    stdin: str | None = None,
    missing: tuple[str, ...] = (),
) -> CLIRun:
    """``nanhunter ARGS`` through the real entry point in this process: ``nan_hunter.cli.main.main``
    with ``argv``, as ``main.run`` calls it, minus the process around it.

    The environment is what ``run_cli`` gives the child (``cli_env``: offline, 160 columns, the
    calling terminal's colour variables cleared; ``env`` on top) and the working directory ``cwd``
    (default: the repository); stdout and stderr are captured (not terminals, as in a pipe), stdin
    is ``stdin`` or empty. ``BadInput`` becomes exit 2 and the one line ``run()`` writes for it;
    ``KeyboardInterrupt`` and any other exception propagate (a test failure with its traceback,
    where the real command would print one line and exit 3). Then a garbage collection: what the
    command left is freed as at the end of a process, so finalizers run (the offload folder of
    ``--device-map`` is removed when its model is freed).

    ``missing``: packages that cannot be imported during the run, as if not installed (their loaded
    modules set aside, then put back). Only for a package the command imports when it needs it
    (matplotlib); one whose presence another library recorded when it was imported (accelerate,
    which transformers looks for once) needs ``run_cli`` with a shim on ``PYTHONPATH``.

    What a command may change for the whole process is put back afterwards, whatever happened:
    the environment (``TMPDIR`` included: ``tempfile`` reads it again; ``PYTHONDONTWRITEBYTECODE`` as
    ``sys.dont_write_bytecode``), the working directory, ``sys.path``/``argv``/standard streams, modules it
    imported from outside the installed libraries and the repository (``--arch`` files), the
    levels of existing loggers, warning filters, the SIGINT handler, the random generators, torch's
    default dtype, thread count, flush-to-zero, grad/anomaly/determinism modes and MHA fast path, transformers'
    progress bars, typer's terminal settings, and nanhunter's per-command globals.
    """
    bad = sorted(k for k in env or {} if k in STARTUP_ONLY_ENV)
    if bad:
        raise ValueError(f"{bad} take effect when a process starts: use run_cli for this test")
    new_env = cli_env(env)
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    with _process_state_restored(new_env, out, err), _not_installed(missing):
        os.chdir(cwd or ROOT)
        sys.stdin = io.StringIO(stdin or "")
        from nan_hunter.cli.main import main
        from nan_hunter.errors import BadInput

        try:
            code = main([str(a) for a in args])
        except BadInput as e:
            err.write(f"nanhunter: error: {e}\n")
            code = 2
        except SystemExit as e:  # click's shell completion ends the command this way
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            with contextlib.suppress(ValueError, OSError):
                out.flush()
                err.flush()
            gc.collect()  # what a process's end frees: the command's objects, and their finalizers run
    return CLIRun(
        code,
        out.buffer.getvalue().decode("utf-8", "replace"),
        err.buffer.getvalue().decode("utf-8", "replace"),
    )


class _NotInstalled:
    """A meta-path finder that finds nothing for ``names``: importing them fails as if absent."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@contextlib.contextmanager
def _not_installed(names: tuple[str, ...]):
    if not names:
        yield
        return
    loaded = {n: m for n, m in sys.modules.items() if n.split(".")[0] in names}
    for n in loaded:
        del sys.modules[n]
    finder = _NotInstalled(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(loaded)


def _outside_libraries(mod: object) -> bool:
    """A module loaded from a file that is neither an installed library nor this repository's
    package (an ``--arch`` file and what it imported beside it)."""
    f = getattr(mod, "__file__", None)
    if not f:
        return False
    f = os.path.realpath(f)
    keep = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    keep.add(str(ROOT / "nan_hunter"))
    return not any(f.startswith(k + os.sep) for k in keep)


#: the warning filters of an interpreter started without -W (``sys.warnoptions`` empty)
_FRESH_FILTERS = (
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, None),
    ("ignore", PendingDeprecationWarning, None),
    ("ignore", ImportWarning, None),
    ("ignore", ResourceWarning, None),
)


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [
        logging.root,
        *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)),
    ]
    return [h for lg in loggers for h in lg.handlers if type(h) is logging.StreamHandler]


@contextlib.contextmanager
def _fresh_stderr(out: io.TextIOWrapper, err: io.TextIOWrapper):
    """stdout and stderr captured as a new process's would be: warnings printed with Python's
    default filters (not recorded by pytest), log records with no handler configured printed by
    logging's last resort (pytest's capture handlers set aside), and the handlers libraries bound
    to the test's streams (transformers') writing to the captured ones."""
    streams = sys.stdout, sys.stderr
    root_handlers, root_level = list(logging.root.handlers), logging.root.level
    moved = [(h, h.stream) for h in _stream_handlers() if h.stream in streams]
    sys.stdout, sys.stderr = out, err
    logging.root.handlers[:] = []  # a new process has none: a record goes to logging.lastResort
    logging.root.setLevel(logging.WARNING)
    for h, stream in moved:
        h.setStream(out if stream is streams[0] else err)
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(_FRESH_FILTERS):
                if module is None:
                    warnings.simplefilter(action, category)
                else:
                    warnings.filterwarnings(action, category=category, module=module)
            warnings.showwarning = warnings._showwarning_orig
            yield
    finally:
        sys.stdout, sys.stderr = streams
        logging.root.handlers[:] = root_handlers
        logging.root.setLevel(root_level)
        for h, stream in moved:
            h.setStream(stream)
        for h in _stream_handlers():  # bound during the run (a library first imported by it)
            if h.stream is out or h.stream is err:
                h.setStream(streams[0] if h.stream is out else streams[1])


@contextlib.contextmanager
def _process_state_restored(new_env: dict[str, str], out: io.TextIOWrapper, err: io.TextIOWrapper):
    saved_env = dict(os.environ)
    cwd = os.getcwd()
    streams = sys.stdin, sys.stdout, sys.stderr
    path, argv = list(sys.path), list(sys.argv)
    modules = set(sys.modules)
    loggers = {n: logging.getLogger(n) for n in _COMMAND_LOGGERS}
    loggers.update(
        {n: lg for n, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    )
    levels = {n: (lg.level, lg.disabled, lg.propagate) for n, lg in loggers.items()}
    root_level, disable = logging.root.level, logging.root.manager.disable
    sigint = signal.getsignal(signal.SIGINT)
    py_random = random.getstate()
    globals_ = _nanhunter_globals()
    torch_state = _torch_state()
    typer_state = _typer_state(new_env)
    tqdm_active = _transformers_progress()
    tmpdir, dont_write_bytecode = tempfile.tempdir, sys.dont_write_bytecode
    os.environ.clear()
    os.environ.update(new_env)
    tempfile.tempdir = None  # read from the run's TMPDIR, as a new process would
    sys.dont_write_bytecode = bool(
        new_env.get("PYTHONDONTWRITEBYTECODE")
    )  # what the variable sets at start-up
    try:
        with _fresh_stderr(out, err):
            yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams
        os.environ.clear()
        os.environ.update(saved_env)
        tempfile.tempdir, sys.dont_write_bytecode = tmpdir, dont_write_bytecode
        os.chdir(cwd)
        sys.path[:], sys.argv[:] = path, argv
        for name in set(sys.modules) - modules:
            if name.startswith("nanhunter_arch_") or _outside_libraries(sys.modules[name]):
                del sys.modules[name]
        for name, lg in loggers.items():
            lg.level, lg.disabled, lg.propagate = levels[name]
        logging.root.level = root_level
        logging.disable(disable)
        for lg in logging.Logger.manager.loggerDict.values():  # levels are cached per logger
            if isinstance(lg, logging.Logger):
                lg._cache.clear()
        logging.root._cache.clear()
        signal.signal(signal.SIGINT, sigint)
        random.setstate(py_random)
        _restore_nanhunter_globals(globals_)
        _restore_torch(torch_state)
        _restore_typer(typer_state)
        _restore_transformers_progress(tqdm_active)


def _nanhunter_globals() -> dict:
    from nan_hunter import outputs
    from nan_hunter.cli import options, output

    return {
        "command_line": options.COMMAND_LINE,
        "started": options.STARTED,
        "written": list(output.WRITTEN),
        "listener": outputs._written_listener,
        "temporaries": set(outputs._temporaries),
    }


def _restore_nanhunter_globals(g: dict) -> None:
    from nan_hunter import outputs
    from nan_hunter.cli import options, output

    options.COMMAND_LINE, options.STARTED = g["command_line"], g["started"]
    output.WRITTEN[:] = g["written"]
    outputs._written_listener = g["listener"]
    outputs._temporaries.clear()
    outputs._temporaries.update(g["temporaries"])


def _torch_state() -> dict:
    import numpy as np
    import torch

    return {
        "dtype": torch.get_default_dtype(),
        "threads": torch.get_num_threads(),
        "grad": torch.is_grad_enabled(),
        "flush_denormal": _flushes_denormals(),
        "anomaly": torch.is_anomaly_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "mha": torch.backends.mha.get_fastpath_enabled(),
        "rng": torch.get_rng_state(),
        "np_rng": np.random.get_state(),
    }


def _flushes_denormals() -> bool:
    """Whether this thread flushes subnormals to zero (torch has no getter: the smallest fp32
    subnormal times one comes back as zero). An ``--arch`` factory may set it."""
    import torch

    return float(torch.tensor([2.0**-149], dtype=torch.float32) * 1.0) == 0.0


def _restore_torch(s: dict) -> None:
    import numpy as np
    import torch

    if _flushes_denormals() != s["flush_denormal"]:
        torch.set_flush_denormal(s["flush_denormal"])
    torch.set_default_dtype(s["dtype"])
    if torch.get_num_threads() != s["threads"]:
        torch.set_num_threads(s["threads"])
    torch.set_grad_enabled(s["grad"])
    torch.set_anomaly_enabled(s["anomaly"])
    torch.use_deterministic_algorithms(s["deterministic"])
    torch.backends.mha.set_fastpath_enabled(s["mha"])
    torch.set_rng_state(s["rng"])
    np.random.set_state(s["np_rng"])


def _typer_state(env: dict[str, str]) -> tuple:
    """typer reads the terminal's variables once, when ``typer.rich_utils`` is imported: set them
    as they would be in a process started with ``env``."""
    import typer.rich_utils as ru

    saved = ru.FORCE_TERMINAL, ru.MAX_WIDTH
    ru.FORCE_TERMINAL = (
        True if env.get("GITHUB_ACTIONS") or env.get("FORCE_COLOR") or env.get("PY_COLORS") else None
    )
    if env.get("_TYPER_FORCE_DISABLE_TERMINAL"):
        ru.FORCE_TERMINAL = False
    ru.MAX_WIDTH = int(env["TERMINAL_WIDTH"]) if env.get("TERMINAL_WIDTH") else None
    return saved


def _restore_typer(saved: tuple) -> None:
    import typer.rich_utils as ru

    ru.FORCE_TERMINAL, ru.MAX_WIDTH = saved


def _transformers_progress() -> bool | None:
    mod = sys.modules.get("transformers.utils.logging")
    return None if mod is None else mod.is_progress_bar_enabled()


def _restore_transformers_progress(before: bool | None) -> None:
    mod = sys.modules.get("transformers.utils.logging")
    if mod is None:
        return
    if before is None:  # imported during the run: as a fresh import leaves it
        before = not os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    (mod.enable_progress_bar if before else mod.disable_progress_bar)()
