"""What a trace records about where it ran: versions, device, numerics settings, the model's
identity and the inputs' hashes. Read when the first root call starts, after the model is built
and inside the caller's autocast, so a factory's or a training loop's own settings are seen.

Torch has no getter for flush-to-zero (``torch.set_flush_denormal``): it is probed, by
multiplying the smallest fp32 subnormal by one on this thread (the thread that runs the model's
small ops) and checking whether it came back as zero.
"""

from __future__ import annotations

import platform
import warnings
import zlib
from importlib import metadata
from typing import Any

import torch
from torch import nn

from ..version import __version__
from .stats import dtype_name, tensor_crc

#: libraries whose versions change numerics (absent ones are recorded as null)
LIBRARIES = ("transformers", "accelerate", "triton", "torchao")


def flush_denormal() -> bool:
    """Whether this thread flushes subnormals to zero (probed: torch has no getter)."""
    tiny = torch.tensor([2.0**-149], dtype=torch.float32)
    return float(tiny * 1.0) == 0.0


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def device_name(device: torch.device) -> str | None:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return _cpu_name()
    return None


def _quiet(get: Any) -> Any:
    """A settings getter, its deprecation warnings kept off the user's terminal."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return get()
        except (AttributeError, RuntimeError):
            return None


def autocast_now() -> dict[str, str] | None:
    """``{device_type, dtype}`` of the autocast the caller runs under (contract's ``run.autocast``)."""
    for dev in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(dev):
                return {"device_type": dev, "dtype": dtype_name(torch.get_autocast_dtype(dev))}
        except (RuntimeError, TypeError):  # a device type this build does not know
            continue
    return None


def environment(
    device: torch.device, dtype: str | None, compile_backend: str | None = None
) -> dict[str, Any]:
    """The environment block of a trace (docs/trace-format.md)."""
    versions = {
        "nanhunter": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cudnn": _quiet(torch.backends.cudnn.version) if torch.backends.cudnn.is_available() else None,
    }
    versions.update({name: _version(name) for name in LIBRARIES})
    return {
        "versions": versions,
        "platform": {
            "system": platform.system(),
            "machine": platform.machine(),
            "cpu_capability": _quiet(torch.backends.cpu.get_cpu_capability),
        },
        "device": str(device),
        "device_name": device_name(device),
        "dtype": dtype,
        "autocast": autocast_now(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "flush_denormal": flush_denormal(),
        "tf32": {
            "matmul": _quiet(lambda: torch.backends.cuda.matmul.allow_tf32),
            "cudnn": _quiet(lambda: torch.backends.cudnn.allow_tf32),
        },
        "matmul_precision": torch.get_float32_matmul_precision(),
        "fp32_precision": {
            name: _quiet(lambda b=b: getattr(b, "fp32_precision", None))
            for name, b in (
                ("matmul", torch.backends.cuda.matmul),
                ("cudnn", torch.backends.cudnn),
                ("mkldnn", torch.backends.mkldnn),
            )
        },
        "mkldnn": bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled),
        "compile": compile_backend,
    }


def model_identity(model: nn.Module, names: list[str]) -> dict[str, Any]:
    """What "the same model" means for a diff: its module names and parameter shapes (the
    weights themselves may differ)."""
    crc, count = 0, 0
    for n, p in model.named_parameters():
        crc = _crc_text(f"{n}:{','.join(map(str, p.shape))};", crc)
        count += p.numel()
    return {
        "class": type(model).__name__,
        "modules": names,
        "parameters": count,
        "param_shapes_hash": f"{crc:08x}",
    }


def _crc_text(text: str, crc: int = 0) -> int:
    return zlib.crc32(text.encode("utf-8", "surrogatepass"), crc)


def _tensors(obj: Any, out: list[tuple[str, torch.Tensor]], prefix: str = "", depth: int = 0) -> None:
    """Every tensor inside plain containers (any dtype: token ids too), with its path."""
    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif depth < 8 and isinstance(obj, dict):
        for k in sorted(obj, key=str):
            _tensors(obj[k], out, f"{prefix}.{k}", depth + 1)
    elif depth < 8 and isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _tensors(v, out, f"{prefix}[{i}]", depth + 1)


def inputs_hash(args: Any, kwargs: Any) -> str:
    """One hash of every tensor a root call was given: their paths, dtypes, shapes and bytes."""
    found: list[tuple[str, torch.Tensor]] = []
    _tensors({"args": args, "kwargs": kwargs}, found)
    crc = 0
    for path, t in found:
        crc = tensor_crc(t, _crc_text(path, crc))
    return f"{crc:08x}"
