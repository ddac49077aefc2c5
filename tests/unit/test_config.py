"""The typed configuration: every shipped key is read by some stage, and bad files get one line."""

from __future__ import annotations

import ast
import functools
import os
import time
from pathlib import Path

import pytest

from nan_hunter.config import Config, config_keys, load_config
from nan_hunter.errors import BadInput

PKG = Path(__file__).resolve().parents[2] / "nan_hunter"
CONFIGS = PKG.parent / "configs"


def _yaml_leaf_keys(path: Path) -> set[str]:
    import yaml

    data = yaml.safe_load(path.read_text())
    out: set[str] = set()
    for k, v in data.items():
        if isinstance(v, dict) and k != "headroom":
            out |= {f"{k}.{kk}" for kk in v}
        elif k == "headroom":
            out |= {f"headroom.{kk}" for kk in v}
        else:
            out.add(k)
    return out


def test_defaults_load_into_typed_objects():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg.near_miss.overflow_fraction == 0.5
    assert cfg.weights.targets == ("fp16", "fp8-e4m3", "fp8-e5m2")
    assert cfg.fp8.recipe("fp8-e5m2").fmt == "fp8-e5m2"
    assert cfg.check.headroom.weights["fp16"].fail == 0.5
    assert cfg.check.dtypes == ("fp16", "bf16")


def test_every_shipped_key_is_in_the_schema():
    shipped = _yaml_leaf_keys(CONFIGS / "default.yaml") | _yaml_leaf_keys(CONFIGS / "ci.yaml")
    assert shipped == set(config_keys())


@functools.cache
def _attributes_read() -> dict[str, frozenset[str]]:
    """Attribute names read (``x.max_listed``) in each module of the package but config.py: code,
    not comments or docstrings. Parsed once for all the keys' tests (each asks the same question of
    the same sources)."""
    out: dict[str, frozenset[str]] = {}
    for p in PKG.rglob("*.py"):
        if p.name == "config.py":
            continue
        tree = ast.parse(p.read_text())
        out[str(p.relative_to(PKG))] = frozenset(
            n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
        )
    return out


@pytest.mark.parametrize("key", config_keys())
def test_every_key_is_read_by_code_outside_config(key):
    """A key nothing reads is a promise the tool does not keep: each leaf must be read as an
    attribute of the typed configuration (``cfg.near_miss.max_listed``) by some stage."""
    parts = key.split(".")
    users = [m for m, attrs in _attributes_read().items() if all(p in attrs for p in parts)]
    assert users, f"config key {key} is read nowhere"


def _write(tmp_path: Path, text: str | bytes) -> str:
    p = tmp_path / "c.yaml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(p)


@pytest.mark.parametrize(
    "text, words",
    [
        ("near_miss: {overflow_fraction: abc}\n", ["near_miss.overflow_fraction", "expected a number"]),
        ("near_miss: {overflow_fraction: 2.0}\n", ["near_miss.overflow_fraction", "<= 1"]),
        ("near_miss: [1, 2]\n", ["near_miss must be a mapping"]),
        ("dtypes: 16\n", ["dtypes", "list of dtype names"]),
        ("dtypes: [fp16, int8]\n", ["dtypes", "unknown dtype"]),
        ("fp8: {compute: int8}\n", ["fp8.compute"]),
        ("fp8: {scaling: blockwise}\n", ["fp8.scaling", "tensorwise"]),
        ("bisect: {granularity: layer}\n", ["bisect.granularity", "leaf"]),
        ("weights: {max_rows: -3}\n", ["weights.max_rows", "whole number"]),
        ("fail_on_nonfinite_weights: yes please\n", ["fail_on_nonfinite_weights", "true or false"]),
        ("near_mis: {}\n", ["unknown key 'near_mis'"]),
        ("near_miss: {overflow_fractoin: 0.5}\n", ["unknown key near_miss.overflow_fractoin"]),
        ("headroom: {weights: {fp16: {warn: 0.9, fail: 0.5}}}\n", ["warn (0.9) is above fail (0.5)"]),
        ("headroom: {weights: {fp16: 0.5}}\n", ["headroom.weights.fp16", "warn"]),
        ("- a\n- b\n", ["expected a mapping"]),
        ("a: [\n", ["not valid YAML"]),
    ],
)
def test_bad_values_are_refused_with_the_key(tmp_path, text, words):
    path = _write(tmp_path, text)
    with pytest.raises(BadInput) as e:
        load_config(path)
    msg = str(e.value)
    assert "\n" not in msg and path in msg
    for w in words:
        assert w in msg, msg


def test_numeric_string_is_read_as_a_number(tmp_path):
    # PyYAML reads 1e-4 (no dot) as a string; it is still the number the user meant
    assert load_config(_write(tmp_path, "diagnosis: {tiny_scale: 1e-4}\n")).diagnosis.tiny_scale == 1e-4


def test_partial_override_keeps_other_defaults(tmp_path):
    cfg = load_config(_write(tmp_path, "near_miss: {max_listed: 3}\n"))
    assert cfg.near_miss.max_listed == 3 and cfg.near_miss.overflow_fraction == 0.5


def test_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 12):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    t = time.monotonic()
    with pytest.raises(BadInput, match="aliases"):
        load_config(_write(tmp_path, "\n".join(lines) + "\n"))
    assert time.monotonic() - t < 2


def test_non_utf8_is_refused(tmp_path):
    with pytest.raises(BadInput, match="not UTF-8"):
        load_config(_write(tmp_path, b"near_miss: {max_listed: 3}\n# \xff\xfe\n"))


def test_deep_nesting_is_refused(tmp_path):
    with pytest.raises(BadInput):
        load_config(_write(tmp_path, "a: " + "[" * 100_000 + "]" * 100_000 + "\n"))


def test_fifo_is_refused_without_blocking(tmp_path):
    p = tmp_path / "fifo.yaml"
    os.mkfifo(p)
    t = time.monotonic()
    with pytest.raises(BadInput, match="not a regular file"):
        load_config(str(p))
    assert time.monotonic() - t < 2


def test_missing_file(tmp_path):
    with pytest.raises(BadInput, match="file not found"):
        load_config(str(tmp_path / "nope.yaml"))
