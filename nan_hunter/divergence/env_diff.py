"""The environment keys two traces differ in (``nanhunter diff``'s ``env_diff``)."""

from __future__ import annotations

from typing import Any

#: keys that say where a file came from, not how the numbers were computed
IGNORED = frozenset(("created", "command"))


def flatten(env: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"versions": {"torch": "2.13"}}`` → ``{"versions.torch": "2.13"}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in env.items():
        key = f"{prefix}{k}"
        if key in IGNORED:
            continue
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def env_diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """``[{key, a, b}]`` for every key whose value differs (absent on one side: None), in A's key
    order then B's."""
    fa, fb = flatten(a), flatten(b)
    keys = list(fa) + [k for k in fb if k not in fa]
    return [{"key": k, "a": fa.get(k), "b": fb.get(k)} for k in keys if fa.get(k) != fb.get(k)]
