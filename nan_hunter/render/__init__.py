"""Rendering: a report as text for each sink. No measuring here; every view formats what the
report holds, and every untrusted string is escaped for its sink.

- ``rows``, ``headroom``: the report as format-neutral rows (shared by every view)
- ``escape``: one escaping function per sink (terminal, JUnit, Actions, HTML, Markdown, plot)
- ``terminal/``: the rich view (rich is imported only there and in ``progress``)
- ``html``, ``markdown``, ``plot``, ``report_file``: ``--report`` files
- ``ci``: JUnit XML and GitHub Actions annotations for ``check``

Render functions return strings or bytes; the few ``write_*`` helpers only hand them to
``outputs`` (atomic writes).
"""
