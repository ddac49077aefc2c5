"""The search strategy behind ``nanhunter bisect``: ``model.keep_search``, where it lives so that
``scan``'s keep-in-higher-precision fix (``explain.keep_fix``) runs the very same search (one
search, one answer). Pure Python; no torch."""

from __future__ import annotations

from ..model.keep_search import PrecisionSearch, SearchResult, minimal_keep_set, run_bound

__all__ = ["PrecisionSearch", "SearchResult", "minimal_keep_set", "run_bound"]
