"""cli/about.py: ``--version``'s lines — nanhunter, Python, torch with its build and device, then
each library from its metadata (never imported), "not installed" for an absent one."""

from __future__ import annotations

import platform
from importlib import metadata

import pytest
import torch

from nan_hunter.cli import about
from nan_hunter.version import __version__


def _lines() -> dict[str, str]:
    return {line.split()[0]: line.split(None, 1)[1] for line in about.version_lines()}


def test_names_in_the_order_a_bug_report_reads_them():
    assert [line.split()[0] for line in about.version_lines()] == [
        "nanhunter",
        "Python",
        "torch",
        *about.LIBRARIES,
    ]
    lines = _lines()
    assert lines["nanhunter"] == __version__ and lines["Python"].startswith(platform.python_version())
    assert lines["torch"].startswith(torch.__version__ + " (") and "device: " in lines["torch"]
    assert lines["safetensors"] == metadata.version("safetensors")


def test_every_line_aligns_its_value():
    assert {line.index(line.split()[1]) for line in about.version_lines()} == {14}


@pytest.mark.parametrize(
    "absent, line",
    [
        ({"triton"}, "not installed"),
        ({"lightning"}, "not installed; pytorch-lightning 2.0.0"),  # the older package name says which
        ({"lightning", "pytorch-lightning"}, "not installed"),
    ],
)
def test_absent_libraries(monkeypatch, absent, line):
    real = metadata.version

    def version(dist):
        if dist in absent:
            raise metadata.PackageNotFoundError(dist)
        return "2.0.0" if dist == "pytorch-lightning" else real(dist)

    monkeypatch.setattr(metadata, "version", version)
    name = "lightning" if "lightning" in absent else "triton"
    assert _lines()[name] == line


def test_cpu_only_build_says_so():
    if torch.cuda.is_available() or getattr(torch.version, "hip", None) or torch.version.cuda:
        pytest.skip("a GPU build")
    assert _lines()["torch"] == f"{torch.__version__} (CPU only); device: none (CPU)"
