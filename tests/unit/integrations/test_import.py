"""Importing nan_hunter (and nan_hunter.integrations, the shared callback core) imports neither
framework (each callback module imports its own when imported). A new process: sys.modules is the point."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
import nan_hunter, nan_hunter.integrations, nan_hunter.integrations.callback_core
from nan_hunter import NonFiniteError
assert issubclass(NonFiniteError, RuntimeError)
bad = [m for m in ("transformers", "lightning", "pytorch_lightning") if m in sys.modules]
assert not bad, bad
print("ok")
"""


def test_no_framework_import():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
