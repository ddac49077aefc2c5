"""Framework callbacks: ``integrations.transformers.NanHunterCallback`` for ``transformers.Trainer``
and ``integrations.lightning.NanHunterCallback`` for ``lightning.Trainer``. Importing this package
imports neither framework (each module imports its own when it is imported)."""
