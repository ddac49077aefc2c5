"""Where two runs part: traces (``trace/``) aligned and compared entry by entry (``nanhunter diff``).

- ``align``: which entry of one trace is which of the other (keys; op sequences per call)
- ``compare``: comparability, the one rule per pair, the first divergence and the first
  difference (regions with no counterpart included), ``DiffResult``
- ``precision``: the dtypes an entry's value carries (its tolerance) and the exact ops
- ``outputs``: whether the runs' outputs are bitwise equal, within tolerance or differ
- ``env_diff``: the environment keys that differ
- ``recordings``: in-memory recordings (``scan --compile``, a watch's re-run) as entries, so they
  are judged by the same comparison
"""
