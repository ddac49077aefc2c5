"""What a command sets for the whole process while it runs (``options.STARTED``, the command line,
the files it announces, the ``outputs`` listener), put back after each test."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _command_globals():
    from nan_hunter import outputs
    from nan_hunter.cli import options, output

    saved = options.COMMAND_LINE, options.STARTED, list(output.WRITTEN), outputs._written_listener
    yield
    options.COMMAND_LINE, options.STARTED, output.WRITTEN[:], outputs._written_listener = saved
