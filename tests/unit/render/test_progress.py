"""render/progress.py: the weights-scan bar appears only once a scan has lasted ``delay`` seconds
(then counts every byte since the start, the tensor's name escaped and shortened), and bisect's
status line says the run count and the last verdict. (StageProgress: tests/unit/test_progress.py.)"""

from __future__ import annotations

import pytest

from nan_hunter.render.progress import BisectProgress, ScanProgress


def test_no_bar_before_the_delay():
    p = ScanProgress(delay=3600)
    p.update("a.weight", 100, total=1000)
    p.update("b.weight", 50, total=1000)
    assert p.bar is None and p.done == 150
    p.close()  # nothing to stop


@pytest.mark.parametrize(
    "name, shown",
    [
        ("a.weight", "a.weight"),
        ("evil\x1b[2J.weight", "evil\\x1b[2J.weight"),  # escaped, never written raw to the terminal
        ("model.layers.10.mlp.experts.63.down_proj.weight.with.a.very.long.tail", None),
    ],
)
def test_bar_counts_every_byte_and_shows_the_name(name, shown):
    p = ScanProgress(delay=0)
    try:
        p.update("first", 100, total=1000)
        p.update(name, 200, total=1000)
        task = p.bar.tasks[0]
        assert (task.completed, task.total) == (300, 1000)
        got = task.fields["name"]
        assert len(got) <= 40 and "\x1b" not in got
        if shown is not None:
            assert got == shown
        else:
            assert got.startswith(("model.", "…")) and got.endswith("tail") and "…" in got
    finally:
        p.close()


def test_bisect_status_line():
    p = BisectProgress()
    try:
        assert str(p.status.status) == "bisect: preparing"
        p.update(3, "finite")
        assert str(p.status.status) == "bisect: run 3 · finite"
    finally:
        p.close()
