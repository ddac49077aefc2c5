"""Model building: ``--arch file.py:factory`` / ``package.module:factory`` with strict weight
loading, or a Hugging Face directory built offline with transformers from its ``config.json``.

Code shipped inside a checkpoint never runs: every transformers loader gets
``trust_remote_code=False``, and a checkpoint that needs its own code (``auto_map`` in its
config files) is refused up front, in one line and without transformers' interactive prompt.
``--arch`` is how a user runs code they trust: importing it writes no ``__pycache__`` next to it,
a ``sys.exit`` inside it is an error (never a clean scan), Ctrl-C interrupts it.

Weights are never silently invented: ``--arch`` loads strictly (every key, every shape), and a
Hugging Face build that transformers would complete with random initialisation is refused
with the names of the missing weights.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import BadInput, install_hint
from ..load import bounded_json
from ..load.checkpoint import Checkpoint, member
from ..load.regular_file import read_regular, require_regular
from ..load.safetensors_header import show

#: Config files in which transformers looks for ``auto_map`` (custom code to import).
CODE_CONFIGS = (
    "config.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model")
LOAD_BATCH = 256 << 20  # bytes of owned tensor copies handed to load_state_dict at a time
_MAX_CONFIG_BYTES = 16 << 20


def hub_offline() -> None:
    """Never reach the Hugging Face Hub (a setting the user made stays)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@contextmanager
def _user_code() -> Iterator[None]:
    """While the user's --arch code runs: no ``__pycache__`` written next to it (it may sit in
    the checkpoint directory, and inputs are never written to)."""
    old = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.dont_write_bytecode = old


@contextmanager
def quiet_while_loading() -> Iterator[None]:
    """While transformers loads: its optional imports (torchao, via its quantizers) and accelerate
    (placing a ``--device-map`` model) log warnings that are not the user's business; stderr
    stays for nanhunter's own line."""
    import logging

    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree", "accelerate")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _exited(spec: str, what: str, e: SystemExit) -> BadInput:
    return BadInput(
        f"--arch {spec!r}: {what} called sys.exit({e.code!r}); the factory must return an "
        "nn.Module, so nothing was scanned"
    )


def load_factory(spec: str) -> Callable[..., Any]:
    if ":" not in spec:
        raise BadInput(f"--arch {spec!r}: expected path/to/file.py:factory or package.module:factory")
    target, _, attr = spec.rpartition(":")
    if not attr.isidentifier():
        raise BadInput(f"--arch {spec!r}: {attr!r} is not a function name")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target)
        if not path.exists():
            raise BadInput(f"--arch {spec!r}: file {path} not found")
        require_regular(path, "--arch")
        name = f"nanhunter_arch_{abs(hash(str(path.resolve())))}"
        mspec = importlib.util.spec_from_file_location(name, path)
        if mspec is None or mspec.loader is None:
            raise BadInput(f"--arch {spec!r}: cannot import {path}")
        mod = importlib.util.module_from_spec(mspec)
        sys.modules[name] = mod
        parent = str(path.parent.resolve())
        sys.path.insert(0, parent)
        try:
            with _user_code():
                mspec.loader.exec_module(mod)
        except SystemExit as e:
            raise _exited(spec, f"importing {path}", e) from None
        except Exception as e:
            raise BadInput(f"--arch {spec!r}: importing {path} raised {type(e).__name__}: {e}") from None
        finally:
            sys.path.remove(parent)
    else:
        try:
            with _user_code():
                mod = importlib.import_module(target)
        except SystemExit as e:
            raise _exited(spec, f"importing {target}", e) from None
        except Exception as e:
            raise BadInput(f"--arch {spec!r}: cannot import {target} ({type(e).__name__}: {e})") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise BadInput(f"--arch {spec!r}: {target} has no callable {attr!r}")
    return fn


def listed_keys(keys: list[str], n: int = 4) -> str:
    """The first ``n`` of ``keys``, shown, and how many more."""
    more = f" and {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(show(k) for k in keys[:n]) + more


def _checkpoint_names(expected: list[str], have: list[str]) -> str:
    """The prefix under which the checkpoint holds the model's keys: "" when they are top-level,
    else e.g. "model." or "state_dict." for a training checkpoint saved as a nested dict."""
    hs = set(have)
    if not expected or all(k in hs for k in expected):
        return ""
    k0 = expected[0]
    for n in have:
        if n.endswith("." + k0):
            prefix = n[: -len(k0)]
            if all(prefix + k in hs for k in expected):
                return prefix
    return ""


def load_strict(model: Any, ck: Checkpoint) -> None:
    """Load ``ck`` into ``model``: every key must match by name and shape (exit 2 otherwise).

    Owned copies go to ``load_state_dict`` in batches of ``LOAD_BATCH`` bytes, so memory stays
    the model plus one batch (or one tensor, if larger), and the file is never written.
    """
    expected = model.state_dict()
    have = ck.names()
    prefix = _checkpoint_names(list(expected), have)
    under = [n[len(prefix) :] for n in have if n.startswith(prefix)]
    missing = sorted(set(expected) - set(under))
    unexpected = sorted(set(under) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys ({listed_keys(missing)})")
        if unexpected:
            parts.append(
                f"unexpected {len(unexpected)} keys ({listed_keys([prefix + k for k in unexpected])})"
            )
        raise BadInput(
            f"weights do not match --arch: {'; '.join(parts)}; check that --arch builds the model this checkpoint came from"
        )
    for k, ref in expected.items():
        e = ck.entry(prefix + k)
        shape = tuple(e.shape) if e is not None else tuple(ck.tensor(prefix + k).shape)
        if shape != tuple(ref.shape):
            raise BadInput(
                f"weights do not match --arch: {show(prefix + k)} has shape {list(shape)} in the "
                f"checkpoint, {list(ref.shape)} in the model"
            )
    batch: dict[str, Any] = {}
    size = 0
    for k in expected:
        t = ck.tensor(prefix + k)
        batch[k] = t
        size += t.numel() * t.element_size()
        if size >= LOAD_BATCH:
            _load_batch(model, batch)
            batch, size = {}, 0
    _load_batch(model, batch)


def _load_batch(model: Any, batch: dict[str, Any]) -> None:
    if not batch:
        return
    try:
        model.load_state_dict(batch, strict=False)  # the key sets were checked whole above
    except RuntimeError as e:
        raise BadInput(f"weights do not match --arch: {str(e).strip().splitlines()[-1][:300]}") from None


def build_from_arch(spec: str, ck: Checkpoint):
    import torch

    fn = load_factory(spec)
    try:
        with _user_code():
            model = fn()
    except SystemExit as e:
        raise _exited(spec, "the factory", e) from None
    except Exception as e:
        raise BadInput(f"--arch {spec!r}: factory raised {type(e).__name__}: {e}") from None
    if not isinstance(model, torch.nn.Module):
        raise BadInput(f"--arch {spec!r}: factory returned {type(model).__name__}, not a torch.nn.Module")
    load_strict(model, ck)
    return model


def custom_code(
    d: Path,
    files: tuple[str, ...] = CODE_CONFIGS,
    keys: tuple[str, ...] | None = None,
    ignore: tuple[str, ...] = (),
) -> str | None:
    """Where checkpoint directory ``d`` asks for its own code (an ``auto_map`` entry), or None.

    ``keys`` limits which ``auto_map`` entries count (e.g. only ``AutoTokenizer``); entries in
    ``ignore`` do not count (the tokenizer's, when the model is built).
    """
    for name in files:
        p = d / name
        if not p.exists():
            continue
        raw = read_regular(member(d, name, f"checkpoint {d}")[1], "checkpoint file", _MAX_CONFIG_BYTES)
        data = bounded_json.loads(raw, str(p), constants=True)  # what transformers' json.loads accepts
        if not isinstance(data, dict):
            continue
        auto_map = data.get("auto_map")
        if isinstance(auto_map, dict):
            hits = {k: v for k, v in auto_map.items() if (keys is None or k in keys) and k not in ignore}
            if hits:
                k, v = next(iter(hits.items()))
                return f"{name} auto_map {k} → {show(v)}"
        elif auto_map and keys is None:
            return f"{name} auto_map → {show(auto_map)}"
        if name == "config.json" and data.get("custom_pipelines") and keys is None:
            return f"{name} custom_pipelines"
    return None


def _refuse_custom(ck: Checkpoint, where: str) -> BadInput:
    return BadInput(
        f"{ck.path}: the checkpoint ships custom code ({where}) that nanhunter does not run; "
        "to run model code you trust, pass --arch file.py:factory"
    )


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else ""


def build_from_hf(ck: Checkpoint, attn: str | None = None, placed: dict[str, Any] | None = None):
    """Architecture from config.json, weights from the directory, all offline, no checkpoint code.
    ``placed``: ``from_pretrained`` keywords of ``--device-map auto`` (``placement.build_placed``)."""
    where = custom_code(ck.path, ("config.json",), ignore=("AutoTokenizer",))
    if where:
        raise _refuse_custom(ck, where)
    hub_offline()
    with quiet_while_loading():
        return _build_from_hf(ck, attn, placed)


def _build_from_hf(ck: Checkpoint, attn: str | None, placed: dict[str, Any] | None = None):
    try:
        import transformers
    except ImportError:
        raise BadInput(
            f"building a Hugging Face model needs transformers: {install_hint('hf')} (or pass --arch)"
        ) from None
    d = str(ck.path)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        config = transformers.AutoConfig.from_pretrained(d, local_files_only=True, trust_remote_code=False)
    except Exception as e:
        if "trust_remote_code" in str(e):
            raise _refuse_custom(ck, "config.json") from None
        raise BadInput(f"{ck.config_path}: transformers cannot read this config ({_first_line(e)})") from None
    cls = None
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, str(name), None)
        if cls is not None:
            break
    cls = cls or transformers.AutoModel
    kw: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False, "output_loading_info": True}
    if attn:
        kw["attn_implementation"] = attn
    kw.update(placed or {})
    try:
        model, info = cls.from_pretrained(d, **kw)
    except Exception as e:
        if "trust_remote_code" in str(e):
            raise _refuse_custom(ck, "config.json") from None
        raise BadInput(
            f"{ck.path}: transformers could not build {cls.__name__} from it "
            f"({type(e).__name__}: {_first_line(e)})"
        ) from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        n = len(model.state_dict())
        raise BadInput(
            f"{ck.path}: the checkpoint lacks {len(missing)} of the {n} weights {cls.__name__} needs "
            f"({listed_keys(missing)}); transformers would fill them with random values, so the scan would "
            "not be of this checkpoint; restore the missing weights or pass --arch file.py:factory"
        )
    mismatched = sorted(info.get("mismatched_keys") or [])
    if mismatched:
        raise BadInput(
            f"{ck.path}: {len(mismatched)} weights have the wrong shape for {cls.__name__} "
            f"({listed_keys([str(m[0]) for m in mismatched])}); check config.json"
        )
    return model


class RefusedTokenizer:
    """Stands in for a tokenizer that needs the checkpoint's own code: using it in any way exits
    2 with the reason, while a run fed ``--inputs`` (which needs no tokenizer) goes ahead."""

    def __init__(self, reason: str):
        self._reason = reason

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise BadInput(self._reason)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise BadInput(self._reason)


def load_tokenizer(ck: Checkpoint):
    if ck.config_path is None:
        return None
    d = ck.path
    if not any((d / f).exists() for f in TOKENIZER_FILES):
        return None
    where = custom_code(d, ("tokenizer_config.json",)) or custom_code(d, ("config.json",), ("AutoTokenizer",))
    if where:
        return RefusedTokenizer(str(_refuse_custom(ck, where)) + " (or pass --inputs FILE.safetensors)")
    hub_offline()
    try:
        from transformers import AutoTokenizer

        with quiet_while_loading():
            return AutoTokenizer.from_pretrained(str(d), local_files_only=True, trust_remote_code=False)
    except Exception as e:
        if "trust_remote_code" in str(e):
            return RefusedTokenizer(
                str(_refuse_custom(ck, "tokenizer")) + " (or pass --inputs FILE.safetensors)"
            )
        raise BadInput(
            f"{d}: cannot load its tokenizer offline ({type(e).__name__}: {_first_line(e)})"
        ) from None


def build_model(
    ck: Checkpoint, arch: str | None, attn: str | None = None, placed: dict[str, Any] | None = None
):
    """(model, tokenizer, how) — how is "arch", "hf" or None for a weights-only scan.
    ``placed``: ``from_pretrained`` keywords of ``--device-map auto`` (Hugging Face directories only)."""
    if placed is not None and (arch or not (ck.format == "hf" and ck.config_path is not None)):
        raise BadInput(
            "--device-map auto needs a Hugging Face directory (config.json + safetensors): "
            "transformers places it; --arch models and bare files are not supported yet"
        )
    if arch:
        return build_from_arch(arch, ck), (load_tokenizer(ck) if ck.config_path else None), "arch"
    if ck.format == "hf" and ck.config_path is not None:
        return build_from_hf(ck, attn, placed), load_tokenizer(ck), "hf"
    return None, None, None
