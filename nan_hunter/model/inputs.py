"""The data set of a run: ``--inputs`` files, then ``--prompt`` texts, then ``--data`` lines.

Each becomes one batch: a dict of ``forward()`` keyword arguments. Names are checked against
``forward()``'s signature before anything runs. Every file is validated with one line naming it
(and the line): ``--inputs`` goes through the strict safetensors parser; ``--data`` must be
UTF-8, one JSON object per line (nesting bounded) whose ``"text"`` is a non-empty string. Text
longer than the model's maximum length is truncated to it, with a note, so a huge line can never
hang a run.
"""

from __future__ import annotations

import inspect
import io
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..load import bounded_json
from ..load.regular_file import open_regular, require_regular

MAX_LINE_BYTES = 16 << 20  # one --data line; longer text than any model takes is truncated anyway
FALLBACK_MAX_TOKENS = 8192  # when neither the tokenizer nor the config states a maximum length
_CHARS_PER_TOKEN = 32  # text kept before tokenizing: far more than max length tokens need


def one_or_many(value: Any, option: str) -> tuple[str, ...]:
    """A repeatable option as the Python API takes it (``prompts``, ``inputs``, ``max_memory``,
    ``checkpoints``): a list of strings or paths, or a single one, which is one item as one flag is
    on the command line. ``prompts="hello"`` is one prompt, never five one-character ones (a
    string is iterable); bytes and anything that is not text are refused naming the option."""
    if value is None:
        return ()
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    elif isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise BadInput(f"{option}: expected a string or a list of strings, got {type(value).__name__}")
    items = []
    for x in value:
        x = os.fspath(x) if isinstance(x, os.PathLike) else x
        if not isinstance(x, str):
            raise BadInput(
                f"{option}: expected a string or a list of strings, got an item of type {type(x).__name__}"
            )
        items.append(x)
    return tuple(items)


def one_path(value: Any, option: str) -> str | None:
    """An option that names one file (``data``): a string or path, or None; a list is refused (one
    ``--data`` file per run)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, os.PathLike) and isinstance(os.fspath(value), str):
        return os.fspath(value)
    raise BadInput(f"{option}: expected one file name (a string or path), got {type(value).__name__}")


@dataclass
class Batch:
    label: str  # "inputs.safetensors", "prompt 0", "data.jsonl:3"
    kwargs: dict[str, Any]
    truncated_to: int | None = None  # tokens, when the text was longer than the model takes
    text: str | None = None  # the prompt or data line, for text inputs


def forward_params(model: Any) -> tuple[list[str], bool]:
    """Named keyword-able parameters of ``model.forward`` and whether it takes ``**kwargs``."""
    sig = inspect.signature(model.forward)
    names = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    varkw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    return names, varkw


def check_names(model: Any, names: list[str], where: str) -> None:
    accepted, _ = forward_params(model)
    bad = [n for n in names if n not in accepted]
    if bad:
        raise BadInput(
            f"{where}: {', '.join(repr(b) for b in bad)} not an argument of "
            f"{type(model).__name__}.forward(); it takes: {', '.join(accepted[:12])}; rename the tensors"
        )


def read_inputs_file(path: str) -> dict[str, Any]:
    """The tensors of an ``--inputs`` safetensors file, as owned copies (a forward may modify them)."""
    from ..load.checkpoint import open_safetensors  # lazy: numpy

    require_regular(path, "--inputs")
    ck = open_safetensors(path, "--inputs")
    if ck.n_tensors == 0:
        raise BadInput(f"--inputs {path}: holds no tensors")
    return dict(ck.tensors())


def _text_of(line: bytes, where: str) -> str | None:
    """The ``"text"`` of one JSONL line (None for a blank line); exit 2 saying what is wrong."""
    if not line.strip():
        return None
    obj = bounded_json.loads(line, where)
    if not isinstance(obj, dict):
        raise BadInput(f'{where}: expected a JSON object with a "text" field, got {type(obj).__name__}')
    if "text" not in obj:
        raise BadInput(
            f'{where}: expected a JSON object with a "text" field per line (keys: '
            f"{', '.join(repr(k)[:40] for k in list(obj)[:6])})"
        )
    text = obj["text"]
    if not isinstance(text, str):
        kind = "null" if text is None else type(text).__name__
        raise BadInput(f'{where}: "text" must be a string, got {kind}')
    if not text:
        raise BadInput(f'{where}: "text" is empty')
    return text


def read_jsonl(path: str) -> list[str]:
    """The texts of a ``--data`` file: one ``{"text": ...}`` JSON object per line."""
    texts = []
    with io.BufferedReader(open_regular(path, "--data")) as f:  # lines bounded by MAX_LINE_BYTES
        i = 0
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            i += 1
            where = f"--data {path}:{i}"
            if len(line) > MAX_LINE_BYTES:
                raise BadInput(f"{where}: line longer than {MAX_LINE_BYTES >> 20} MiB; split the text")
            if i == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]  # a UTF-8 byte-order mark some editors write
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise BadInput(
                    f"{where}: not UTF-8 (invalid byte at column {e.start + 1}); save the file as UTF-8"
                ) from None
            text = _text_of(line, where)
            if text is not None:
                texts.append(text)
    if not texts:
        raise BadInput(f'--data {path}: empty data set (no lines with {{"text": ...}})')
    return texts


def max_tokens(tokenizer: Any, model: Any) -> int:
    """The longest input the model takes, in tokens: the smallest the tokenizer or config states."""
    found = []
    m = getattr(tokenizer, "model_max_length", None)
    if isinstance(m, int) and 0 < m < 1_000_000:  # transformers uses 1e30 for "unknown"
        found.append(m)
    cfg = getattr(model, "config", None)
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            found.append(v)
    return min(found) if found else FALLBACK_MAX_TOKENS


def tokenize(
    tokenizer: Any, text: str, model: Any, limit: int | None = None
) -> tuple[dict[str, Any], int | None]:
    """(forward kwargs, tokens truncated to or None): text over ``limit`` tokens is cut to it."""
    limit = limit or max_tokens(tokenizer, model)
    keep = limit * _CHARS_PER_TOKEN
    cut = text[:keep]
    enc = tokenizer(cut, return_tensors="pt", truncation=True, max_length=limit)
    truncated = len(cut) < len(text)
    if not truncated and enc["input_ids"].shape[-1] >= limit:
        truncated = len(tokenizer(cut, truncation=True, max_length=limit + 1)["input_ids"]) > limit
    accepted, _ = forward_params(model)
    return {k: v for k, v in enc.items() if k in accepted}, (limit if truncated else None)


def batch_notes(batches: list[Batch]) -> list[str]:
    """One note for the inputs whose text was truncated to the model's maximum length."""
    cut = [b for b in batches if b.truncated_to]
    if not cut:
        return []
    names = ", ".join(b.label for b in cut[:5]) + (f" and {len(cut) - 5} more" if len(cut) > 5 else "")
    return [
        f"{len(cut)} input(s) longer than the model's maximum length were truncated to "
        f"{cut[0].truncated_to} tokens: {names}"
    ]


def build_batches(
    model: Any, tokenizer: Any, inputs: list[str] | None, prompts: list[str] | None, data: str | None
) -> list[Batch]:
    batches: list[Batch] = []
    for path in inputs or []:
        kw = read_inputs_file(path)
        check_names(model, list(kw), f"--inputs {path}")
        batches.append(Batch(Path(path).name, kw))
    texts = [(f"prompt {i}", t) for i, t in enumerate(prompts or [])]
    if data:
        texts += [(f"{Path(data).name}:{i + 1}", t) for i, t in enumerate(read_jsonl(data))]
    if texts and tokenizer is None:
        raise BadInput(
            "--prompt/--data need a tokenizer: use a model directory with tokenizer.json "
            "(or give --inputs FILE.safetensors)"
        )
    if texts:
        limit = max_tokens(tokenizer, model)
        for label, t in texts:
            kw, cut = tokenize(tokenizer, t, model, limit)
            batches.append(Batch(label, kw, cut, t))
    return batches
