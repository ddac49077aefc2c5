"""Thresholds and presets from ``configs/*.yaml``; ``--config FILE`` is deep-merged on top."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import BadInput

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise BadInput(f"--config {path}: cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise BadInput(f"--config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise BadInput(f"--config {path}: expected a mapping at the top level")
    return data


def load_config(path: str | None = None, preset: str = "default") -> dict[str, Any]:
    cfg = _read(CONFIG_DIR / f"{preset}.yaml")
    if path:
        p = Path(path)
        if not p.is_file():
            raise BadInput(f"--config {path}: file not found")
        cfg = _merge(cfg, _read(p))
    return cfg
