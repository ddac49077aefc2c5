"""Model building: ``--arch file.py:factory`` / ``package.module:factory`` with strict weight
loading, or a Hugging Face directory built offline with transformers from its ``config.json``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from .errors import BadInput
from .load import Checkpoint


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def load_factory(spec: str):
    if ":" not in spec:
        raise BadInput(f"--arch {spec!r}: expected path/to/file.py:factory or package.module:factory")
    target, _, attr = spec.rpartition(":")
    if not attr.isidentifier():
        raise BadInput(f"--arch {spec!r}: {attr!r} is not a function name")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise BadInput(f"--arch {spec!r}: file {path} not found")
        name = f"nanhunter_arch_{abs(hash(str(path.resolve())))}"
        mspec = importlib.util.spec_from_file_location(name, path)
        if mspec is None or mspec.loader is None:
            raise BadInput(f"--arch {spec!r}: cannot import {path}")
        mod = importlib.util.module_from_spec(mspec)
        sys.modules[name] = mod
        sys.path.insert(0, str(path.parent.resolve()))
        try:
            mspec.loader.exec_module(mod)
        except Exception as e:
            raise BadInput(f"--arch {spec!r}: importing {path} raised {type(e).__name__}: {e}") from None
        finally:
            sys.path.remove(str(path.parent.resolve()))
    else:
        try:
            mod = importlib.import_module(target)
        except Exception as e:
            raise BadInput(f"--arch {spec!r}: cannot import {target} ({type(e).__name__}: {e})") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise BadInput(f"--arch {spec!r}: {target} has no callable {attr!r}")
    return fn


def _names(keys: list[str], n: int = 4) -> str:
    more = f" and {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def load_strict(model: Any, ck: Checkpoint) -> None:
    """Load ``ck`` into ``model``: every key must match by name and shape (exit 2 otherwise)."""
    expected = model.state_dict()
    have = set(ck.names())
    missing = sorted(set(expected) - have)
    unexpected = sorted(have - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys ({_names(missing)})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} keys ({_names(unexpected)})")
        raise BadInput(f"weights do not match --arch: {'; '.join(parts)}; check that --arch builds the model this checkpoint came from")
    sd = {}
    for k, ref in expected.items():
        t = ck.tensor(k)
        if tuple(t.shape) != tuple(ref.shape):
            raise BadInput(f"weights do not match --arch: {k} has shape {list(t.shape)} in the checkpoint, "
                           f"{list(ref.shape)} in the model")
        sd[k] = t
    model.load_state_dict(sd, strict=True)


def build_from_arch(spec: str, ck: Checkpoint):
    import torch

    fn = load_factory(spec)
    try:
        model = fn()
    except Exception as e:
        raise BadInput(f"--arch {spec!r}: factory raised {type(e).__name__}: {e}") from None
    if not isinstance(model, torch.nn.Module):
        raise BadInput(f"--arch {spec!r}: factory returned {type(model).__name__}, not a torch.nn.Module")
    load_strict(model, ck)
    return model


def build_from_hf(ck: Checkpoint, attn: str | None = None):
    """Architecture from config.json, weights from the directory, all offline."""
    _offline()
    try:
        import transformers
    except ImportError:
        raise BadInput("building a Hugging Face model needs transformers: pip install 'nan-hunter[hf]' "
                       "(or pass --arch)") from None
    d = str(ck.path)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        config = transformers.AutoConfig.from_pretrained(d, local_files_only=True)
    except Exception as e:
        raise BadInput(f"{ck.config_path}: transformers cannot read this config ({str(e).splitlines()[0]})") from None
    cls = None
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            break
    cls = cls or transformers.AutoModel
    kw: dict[str, Any] = {"local_files_only": True}
    if attn:
        kw["attn_implementation"] = attn
    try:
        model = cls.from_pretrained(d, **kw)
    except Exception as e:
        raise BadInput(f"{ck.path}: transformers could not build {cls.__name__} from it "
                       f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return model


def load_tokenizer(ck: Checkpoint):
    if ck.config_path is None:
        return None
    d = ck.path
    if not any((d / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model")):
        return None
    _offline()
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except Exception as e:
        raise BadInput(f"{d}: cannot load its tokenizer offline ({type(e).__name__}: {e})") from None


def build_model(ck: Checkpoint, arch: str | None, attn: str | None = None):
    """(model, tokenizer, how) — how is "arch", "hf" or None for a weights-only scan."""
    if arch:
        return build_from_arch(arch, ck), (load_tokenizer(ck) if ck.config_path else None), "arch"
    if ck.format == "hf" and ck.config_path is not None:
        return build_from_hf(ck, attn), load_tokenizer(ck), "hf"
    return None, None, None
