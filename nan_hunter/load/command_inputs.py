"""What must never be written: every file a command reads (its checkpoint with the index and the
shards the index names, ``--inputs``/``--data``/``--config``/``--arch`` files, the packaged
defaults), for ``outputs.check_outputs``. A sharded index is read by the loader's own parser
(``checkpoint.read_index``), so a malformed one is refused here as the loader would refuse it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import BadInput


def arch_file(spec: str | None) -> Path | None:
    """The file of ``--arch path/to/file.py:factory`` (None for ``package.module:factory``)."""
    if not spec or ":" not in spec:
        return None
    target = spec.rpartition(":")[0]
    if target.endswith(".py") or os.sep in target or "/" in target:
        return Path(target)
    return None


def _index_shards(index: Path) -> list[Path]:
    """Shard files a sharded index names, read by the loader's own parser (``load.checkpoint.
    read_index``): a malformed ``*.safetensors.index.json`` is refused here as the loader would
    refuse it (exit 2, one line). Another ``*.index.json`` in a model directory (a
    ``pytorch_model.bin.index.json``) is not the loader's to read: its shards are protected when it
    parses, and it is otherwise left alone."""
    from .checkpoint import read_index  # lazy: numpy

    try:
        if not index.is_file():
            return []
        shards = read_index(index)
    except BadInput:
        if index.name.endswith(".safetensors.index.json"):
            raise
        return []
    except OSError:
        return []
    return [index.parent / f for f in shards]


def checkpoint_files(path: str | os.PathLike[str]) -> list[Path]:
    """Every file nanhunter may read for this checkpoint: the file itself; an index and its shards;
    for a directory, every file in it (weights, index, config, tokenizer, ...) and the shards its
    indexes name."""
    p = Path(path)
    files: list[Path] = []
    if p.is_dir():
        try:
            children = list(p.iterdir())
        except OSError:
            children = []
        for c in children:
            files.append(c)
            if c.name.endswith(".index.json"):
                files += _index_shards(c)
    else:
        files.append(p)
        if p.name.endswith(".index.json"):
            files += _index_shards(p)
    return files


def input_files(
    checkpoints: Iterable[str] = (),
    inputs: Iterable[str] | None = None,
    data: str | None = None,
    config: str | None = None,
    arch: str | None = None,
) -> list[Path]:
    """All files a command reads, for ``check_outputs``: the user's and the packaged defaults
    (``nan_hunter/configs/*.yaml``)."""
    files: list[Path] = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    for ck in checkpoints:
        files += checkpoint_files(ck)
    files += [Path(f) for f in (inputs or [])]
    files += [Path(f) for f in (data, config) if f]
    a = arch_file(arch)
    if a is not None:
        files.append(a)
    return files
