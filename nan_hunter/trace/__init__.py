"""Numerics traces (``nanhunter.trace/v1``, docs/trace-format.md): what one run computed, entry by
entry, with the environment it ran in, for ``nanhunter diff``.

- ``stats``: an entry's statistics, the same torch ops on every device; the byte hash
- ``env``: versions, device, numerics settings, model identity, input hashes
- ``format``: the file (JSON lines), its writer and typed entries; ``reader``: strict reading
- ``rule``: the one rule two recordings of an entry are compared by (diff, spread, compile, reproducible)
- ``recorder``: ``TraceRecorder``, an observer of the capture ``Recorder`` (which hooks the model for it) that writes it
- ``boundaries``: a compiled run's module calls, each module compiled alone on eager's inputs
"""
