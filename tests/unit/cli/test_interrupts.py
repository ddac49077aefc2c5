"""cli/interrupts.py: Ctrl-C's one line, said once, with the temporary output files removed; the
watchdog is armed only by the main thread when nobody else owns SIGINT. (Exit 130 within a second
from a real process: tests/integration/test_outputs.py.)"""

from __future__ import annotations

import signal
import threading

import pytest

from nan_hunter import outputs
from nan_hunter.cli import interrupts


@pytest.fixture
def fresh():
    interrupts._reported.clear()
    yield
    interrupts._reported.clear()


def test_one_line_once_and_temporaries_removed(fresh, tmp_path, capsys, monkeypatch):
    tmp = tmp_path / "r.json.nanhunter-tmp"
    tmp.write_text("half a report")
    monkeypatch.setattr(outputs, "_temporaries", {str(tmp)})
    interrupts.report_interrupt()
    assert capsys.readouterr().err == interrupts.MESSAGE == "nanhunter: interrupted\n"
    assert not tmp.exists() and outputs._temporaries == set()
    interrupts.report_interrupt()
    assert capsys.readouterr().err == ""
    assert interrupts.EXIT_CODE == 130


def _wakeup_fd() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def test_not_armed_off_the_main_thread():
    before = _wakeup_fd()
    t = threading.Thread(target=interrupts.install)
    t.start()
    t.join()
    assert _wakeup_fd() == before


def test_not_armed_when_someone_else_owns_ctrl_c():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are the main thread's")
    before = _wakeup_fd()
    old = signal.signal(signal.SIGINT, lambda *a: None)
    try:
        interrupts.install()
        assert _wakeup_fd() == before
    finally:
        signal.signal(signal.SIGINT, old)
