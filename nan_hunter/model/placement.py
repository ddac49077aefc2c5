"""``scan --device-map auto [--max-memory DEV=SIZE ...]``: a model bigger than one device, placed
by accelerate as transformers does it (``from_pretrained(device_map="auto", max_memory=...,
offload_folder=...)``): GPUs first, then CPU memory, then disk.

The offload folder is a fresh temporary directory (never inside the checkpoint: inputs are not
written to), removed when the model is freed or the process exits. Offloaded modules keep their
parameters on the ``meta`` device between calls; accelerate's hook (``module._hf_hook``, an
``AlignDevicesHook``) loads them from its ``weights_map`` inside the module's forward. Capture
measures such a parameter through that ``weights_map`` (``offloaded_value``), so the statistics
are of the real values; one with no source is not measured and the report says so
(``unmeasured``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput, install_hint

INSTALL = f"{install_hint('accelerate')} (or pip install accelerate)"
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


@dataclass(frozen=True)
class Placement:
    """What ``--device-map``/``--max-memory`` asked for: accelerate's ``max_memory`` keys (GPU
    index or "cpu") to bytes; devices not named keep what accelerate finds available."""

    device_map: str = "auto"
    max_memory: tuple[tuple[int | str, int], ...] = ()


def parse_size(text: str, flag: str = "--max-memory") -> int:
    """``200MB``, ``1.5GiB``, ``4096`` (bytes) → bytes; exit 2 for anything else."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise BadInput(
            f"{flag}: size {text!r} not understood; use a number with B, KB, MB, GB, TB, "
            "KiB, MiB, GiB or TiB, e.g. cpu=200MB"
        )
    n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise BadInput(f"{flag}: size {text!r} must be more than 0 bytes")
    return n


def _device_key(text: str) -> int | str:
    t = text.strip().lower()
    if t == "cpu":
        return "cpu"
    m = re.fullmatch(r"(?:cuda:)?([0-9]+)", t)
    if m is None:
        raise BadInput(
            f"--max-memory: device {text!r} not understood; use cpu, cuda:N or N (a GPU index), "
            "e.g. --max-memory cpu=200MB --max-memory cuda:0=10GiB"
        )
    return int(m.group(1))


def parse(device_map: str | None, max_memory: list[str] | None) -> Placement | None:
    """The options, validated (exit 2 in one line); None without ``--device-map``."""
    if device_map is None:
        if max_memory:
            raise BadInput("--max-memory needs --device-map auto")
        return None
    if device_map != "auto":
        raise BadInput(
            f"--device-map {device_map!r}: only auto is supported (accelerate places the model "
            "across GPUs, CPU memory and disk)"
        )
    limits: dict[int | str, int] = {}
    for item in max_memory or []:
        dev, sep, size = item.partition("=")
        if not sep or not dev.strip() or not size.strip():
            raise BadInput(f"--max-memory {item!r}: expected DEVICE=SIZE, e.g. cpu=200MB or cuda:0=10GiB")
        key = _device_key(dev)
        if key in limits:
            raise BadInput(f"--max-memory: {dev.strip()} is given twice; give each device once")
        limits[key] = parse_size(size.strip(), f"--max-memory {item}")
    placement = Placement(device_map, tuple(limits.items()))
    require_accelerate()
    check_devices(placement)
    return placement


def require_accelerate() -> None:
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise BadInput(f"--device-map auto needs accelerate: {INSTALL}") from None


def check_devices(placement: Placement) -> None:
    """GPU indices in ``--max-memory`` must exist on this machine."""
    gpus = [k for k, _ in placement.max_memory if isinstance(k, int)]
    if not gpus:
        return
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bad = [k for k in gpus if k >= n]
    if bad:
        raise BadInput(
            f"--max-memory: GPU {bad[0]} does not exist here ({n} CUDA device(s)); "
            "name only devices this machine has"
        )


def offload_dir(checkpoint: Path) -> str:
    """A fresh temporary directory for accelerate's disk offload, never inside the checkpoint
    (exit 2 if the temporary area is in it). The caller removes it (``remove_with``)."""
    import tempfile

    base = Path(tempfile.gettempdir()).resolve()
    ck = checkpoint.resolve()
    ck_dir = ck if ck.is_dir() else ck.parent
    if base == ck_dir or ck_dir in base.parents:
        raise BadInput(
            f"--device-map: the temporary directory {base} is inside the checkpoint's directory "
            f"{ck_dir}; set TMPDIR to a directory outside it (the offload folder goes there)"
        )
    return tempfile.mkdtemp(prefix="nanhunter-offload-")


def remove_with(owner: Any, path: str) -> None:
    """Remove ``path`` when ``owner`` (the model) is freed, or at exit at the latest."""
    import shutil
    import weakref

    weakref.finalize(owner, shutil.rmtree, path, True)


def max_memory(placement: Placement) -> dict[int | str, int] | None:
    """accelerate's ``max_memory``: what accelerate finds available, with the user's limits over it."""
    if not placement.max_memory:
        return None
    from accelerate.utils import get_max_memory

    found = get_max_memory()
    found.update(dict(placement.max_memory))
    found.pop("disk", None)
    return found


def input_device(model: Any) -> Any:
    """Where a placed model takes its inputs: the device of the first placed module."""
    import torch

    placed = getattr(model, "hf_device_map", None) or {}
    for where in placed.values():
        if isinstance(where, int):
            return torch.device("cuda", where)
        if isinstance(where, str) and where not in ("cpu", "disk", "meta"):
            return torch.device(where)
        break
    return torch.device("cpu")


def _hooks(module: Any) -> list[Any]:
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    return list(getattr(hook, "hooks", None) or [hook])  # a SequentialHook holds several


def offloaded_value(module: Any, name: str, tensor: Any) -> Any:
    """The real value of ``module``'s parameter or buffer ``name`` (dotted, relative to
    ``module``) that accelerate keeps off the module (``tensor`` is on ``meta``): read through
    the owning module's hook ``weights_map``, in the tensor's dtype. None when there is none."""
    owner_name, _, leaf = name.rpartition(".")
    try:
        owner = module.get_submodule(owner_name) if owner_name else module
    except AttributeError:
        return None
    for hook in _hooks(owner):
        wm = getattr(hook, "weights_map", None)
        if wm is None:
            continue
        try:
            value = wm[leaf]
        except KeyError:
            continue
        return value.detach().to(tensor.dtype)
    return None


@contextmanager
def materialized(model: Any, name: str) -> Iterator[None]:
    """While inside: the offloaded parameters and buffers of module ``name``'s subtree hold their
    real values on the hook's execution device and accelerate does not load or offload them, so
    an op-level re-run of that module sees only the model's own ops (not the loading ops, which
    would be "first" to hold a NaN stored in a weight) and a replay copies real weights. The
    root is never materialized (that would load the whole model). A no-op for unplaced models."""
    target = model.get_submodule(name) if name else None
    held: list[tuple[Any, Any, str, Any]] = []  # (module, hook, tensor name, meta placeholder)
    if target is not None:
        for mod in target.modules():
            for hook in _hooks(mod):
                if not getattr(hook, "offload", False) or getattr(hook, "weights_map", None) is None:
                    continue
                tensors = list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False))
                for pn, t in tensors:
                    if t is not None and t.device.type == "meta":
                        held.append((mod, hook, pn, t))
    if not held:
        yield
        return
    from accelerate.utils import set_module_tensor_to_device

    hooks = {id(h): h for _, h, _, _ in held}
    try:
        for mod, hook, pn, t in held:
            value = offloaded_value(mod, pn, t)
            if value is not None:
                set_module_tensor_to_device(mod, pn, hook.execution_device, value=value)
        for h in hooks.values():
            h.offload = False
        yield
    finally:
        for h in hooks.values():
            h.offload = True
        for mod, _, pn, _ in held:
            set_module_tensor_to_device(mod, pn, "meta")


def unmeasured(model: Any) -> list[str]:
    """Floating parameters and buffers on ``meta`` that no hook can give the value of."""
    out = []
    for mname, mod in model.named_modules():
        for pn, p in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            if (
                p is not None
                and p.device.type == "meta"
                and p.is_floating_point()
                and offloaded_value(mod, pn, p) is None
            ):
                out.append(f"{mname}.{pn}" if mname else pn)
    return out


def placement_notes(model: Any) -> list[str]:
    """Where accelerate put the modules, and the offloaded values capture could not read."""
    placed = getattr(model, "hf_device_map", None) or {}
    counts: dict[str, int] = {}
    for where in placed.values():
        key = f"cuda:{where}" if isinstance(where, int) else str(where)
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return ["--device-map auto: the whole model fits on one device, nothing was offloaded"]
    parts = ", ".join(f"{n} module group(s) on {d}" for d, n in counts.items())
    offloaded = any(p.device.type == "meta" for p in model.parameters())
    notes = [
        f"--device-map auto: {parts}"
        + (
            "; offloaded weights are loaded by accelerate at each call, and "
            "their statistics read from its offload store"
            if offloaded
            else ""
        )
    ]
    missing = unmeasured(model)
    if missing:
        notes.append(
            f"--device-map auto: {len(missing)} offloaded parameter(s)/buffer(s) have no readable "
            f"value and were not measured: {', '.join(missing[:5])}"
        )
    return notes


def cast_buffers(model: Any, dtype: Any) -> None:
    """Floating buffers held on a device to the run's compute dtype, as ``execute.cast_model``
    casts them on an unplaced model (transformers keeps e.g. rotary ``inv_freq`` in fp32 when it
    builds in a dtype; the one dtype rule casts every floating buffer)."""
    for mod in model.modules():
        for name, buf in list(mod._buffers.items()):
            if (
                buf is not None
                and buf.is_floating_point()
                and buf.device.type != "meta"
                and buf.dtype != dtype
            ):
                mod._buffers[name] = buf.to(dtype)


def dtype_keyword() -> str:
    """``from_pretrained``'s dtype keyword: ``dtype`` from transformers 4.56 on, ``torch_dtype``
    before (4.5x takes an unknown ``dtype`` as a config attribute and fails to serialise it)."""
    import transformers
    from packaging.version import Version  # a dependency of transformers

    return "dtype" if Version(transformers.__version__).release >= (4, 56) else "torch_dtype"


def _whole_model_on_disk(e: BadInput) -> BadInput | None:
    """transformers 4.x cannot load a model that ``device_map="auto"`` put entirely on disk: its
    loader opens the checkpoint with ``safe_open(device="disk")``, which safetensors refuses. That
    failure (the ``SafetensorError`` behind ``e``), said with its fix; None for any other."""
    import transformers
    from packaging.version import Version  # a dependency of transformers

    cause = e.__context__  # build_model's BadInput is raised ``from None`` in its except clause
    if type(cause).__name__ != "SafetensorError" or Version(transformers.__version__).release >= (5,):
        return None
    return BadInput(
        f"--device-map auto: transformers {transformers.__version__} cannot load a model placed "
        "entirely on disk (the --max-memory limits leave no module in memory); raise --max-memory "
        "cpu=SIZE to hold at least one module, or upgrade to transformers>=5.0"
    )


def build_placed(ck: Any, arch: str | None, attn: str | None, placement: Placement, torch_dtype: Any):
    """(model, tokenizer, how) with the model placed by accelerate in ``torch_dtype`` (a placed
    model cannot be cast or moved afterwards)."""
    import shutil

    from .build import build_model  # lazy: numpy

    path = offload_dir(ck.path)
    kw: dict[str, Any] = {
        "device_map": placement.device_map,
        "offload_folder": path,
        dtype_keyword(): torch_dtype,
    }
    limits = max_memory(placement)
    if limits:
        kw["max_memory"] = limits
    try:
        model, tok, how = build_model(ck, arch, attn, placed=kw)
    except BadInput as e:
        shutil.rmtree(path, True)
        raise _whole_model_on_disk(e) or e from None
    except BaseException:
        shutil.rmtree(path, True)
        raise
    remove_with(model, path)
    cast_buffers(model, torch_dtype)
    return model, tok, how
