"""Model: from a checkpoint to a model and batches ready to run at a precision.

- ``build``: ``--arch`` factories and transformers models from ``config.json``
- ``inputs``: ``--inputs`` / ``--prompt`` / ``--data`` → batches
- ``placement``: ``--device-map auto`` through accelerate
- ``execute``: device, casting by the one dtype rule, forwards and re-runs of one call
- ``fp8``: fp8 emulation (a dispatch mode)
- ``policy``: ``apply_policy`` (keep modules in a higher precision)
- ``prepare``: ``Prepared``, everything a run needs, built once
"""
