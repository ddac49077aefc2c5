"""Session: ``nan_hunter.watch`` — a recording that owns ``report()``.

- ``watcher``: ``Watch``, the context manager, and report location from what it kept
- ``training_state``: what backward, optimizer steps, GradScaler and capsules add
- ``watch_report``: what ``report()`` returns
"""
