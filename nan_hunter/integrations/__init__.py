"""Framework callbacks: ``integrations.transformers.NanHunterCallback`` for ``transformers.Trainer``
and ``integrations.lightning.NanHunterCallback`` for ``lightning.Trainer``; SGLang's
``--forward-hooks`` factory (``integrations.sglang.hook_factory``). Importing this package
imports neither framework (each module imports its own when it is imported)."""
