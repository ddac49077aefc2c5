"""``python -m nan_hunter`` = the ``nanhunter`` command."""

from nan_hunter.cli.main import run

run()
