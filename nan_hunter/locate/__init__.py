"""Locate: the first non-finite value in recorded calls (``producer``), then the aten op that
made it (``first_op``, a re-run of that one call under a dispatch mode)."""
