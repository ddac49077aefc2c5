"""The data set of a run: ``--inputs`` files, then ``--prompt`` texts, then ``--data`` lines.

Each becomes one batch: a dict of ``forward()`` keyword arguments. Names are checked against
``forward()``'s signature before anything runs.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BadInput


@dataclass
class Batch:
    label: str  # "inputs.safetensors", "prompt 0", "data.jsonl:3"
    kwargs: dict[str, Any]


def forward_params(model: Any) -> tuple[list[str], bool]:
    """Named keyword-able parameters of ``model.forward`` and whether it takes ``**kwargs``."""
    sig = inspect.signature(model.forward)
    names = [p.name for p in sig.parameters.values()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    varkw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    return names, varkw


def check_names(model: Any, names: list[str], where: str) -> None:
    accepted, _ = forward_params(model)
    bad = [n for n in names if n not in accepted]
    if bad:
        raise BadInput(f"{where}: {', '.join(repr(b) for b in bad)} not an argument of "
                       f"{type(model).__name__}.forward(); it takes: {', '.join(accepted[:12])}; rename the tensors")


def read_inputs_file(path: str) -> dict[str, Any]:
    from .load import open_checkpoint

    p = Path(path)
    if not p.is_file():
        raise BadInput(f"--inputs {path}: file not found")
    ck = open_checkpoint(p)
    if ck.n_tensors == 0:
        raise BadInput(f"--inputs {path}: holds no tensors")
    # Inputs are small: copy them out of the map so a forward may modify them in place.
    return {n: t.clone() for n, t in ck.tensors()}


def read_jsonl(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"--data {path}: file not found")
    texts = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            texts.append(str(obj["text"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise BadInput(f"--data {path}:{i}: expected a JSON object with a \"text\" field per line") from None
    if not texts:
        raise BadInput(f"--data {path}: empty data set (no lines with {{\"text\": ...}})")
    return texts


def tokenize(tokenizer: Any, text: str, model: Any) -> dict[str, Any]:
    enc = tokenizer(text, return_tensors="pt")
    accepted, _ = forward_params(model)
    return {k: v for k, v in enc.items() if k in accepted}


def build_batches(model: Any, tokenizer: Any, inputs: list[str] | None, prompts: list[str] | None,
                  data: str | None) -> list[Batch]:
    batches: list[Batch] = []
    for path in inputs or []:
        kw = read_inputs_file(path)
        check_names(model, list(kw), f"--inputs {path}")
        batches.append(Batch(Path(path).name, kw))
    texts = [(f"prompt {i}", t) for i, t in enumerate(prompts or [])]
    if data:
        texts += [(f"{Path(data).name}:{i + 1}", t) for i, t in enumerate(read_jsonl(data))]
    if texts and tokenizer is None:
        raise BadInput("--prompt/--data need a tokenizer: use a model directory with tokenizer.json "
                       "(or give --inputs FILE.safetensors)")
    for label, t in texts:
        batches.append(Batch(label, tokenize(tokenizer, t, model)))
    return batches
