"""The one table of hostile names every sink's test runs through, and the checks they share.

Each entry is a string an attacker (or an accident) can put in a tensor name, a module path, a
class name, a file path or a prompt: terminal escape sequences, C1 controls, bidi overrides,
markup for each sink, characters XML 1.0 forbids, an undecodable file name.
"""

from __future__ import annotations

import unicodedata

import pytest

HOSTILE: list[tuple[str, str]] = [
    ("ansi-clear-and-retitle", "\x1b[2J\x1b]0;pwned\x07"),
    ("ansi-colour", "w\x1b[31mred\x1b[0m.weight"),
    ("ansi-hyperlink", "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"),
    ("c1-csi-osc", "a\x9b2J\x9d0;t\x9c.b"),
    ("bell-backspace-del", "a\x07\x08\x7fb"),
    ("bidi-override", "layer.\u202egpj.exe\u202c.weight"),
    ("bidi-isolate-marks", "\u2066x\u2069\u200e\u200f"),
    ("zero-width", "lm\u200b_head\ufeff"),
    ("line-separators", "a\u2028b\u2029c\x85d"),
    ("newlines-tabs", "a\nb\r\nc\td\x0b\x0c"),
    ("nul", "x\x00y"),
    ("xml-forbidden", "\x01\x02\x1f\ufffe\uffff"),
    ("surrogate-escape", "ckpt\udc80\udcff.safetensors"),
    ("rich-markup", "[bold red]x[/bold red][link=file:///etc/passwd]y[/link][/]"),
    ("rich-emoji", ":pile_of_poo: :smile:"),
    ("html", "<script>alert(1)</script><img src=x onerror=alert(1)>&amp;\"'"),
    ("markdown", "**b** _i_ `c` [l](http://x) ![i](y) | # > ~~s~~ <http://x> @team #1"),
    ("mathtext", "$\\frac{1}{0}$ and $x_$"),
    ("actions", "%0A::error::x %25 a:b,c\r\n::warning::y"),
    ("backslashes", "C:\\path\\x1b\\u202e"),
    ("wide", "层.权重.🙂"),
    ("long", "model." + "layers.0." * 30 + "down_proj"),
]

IDS = [name for name, _ in HOSTILE]
VALUES = [value for _, value in HOSTILE]

hostile = pytest.mark.parametrize("name", VALUES, ids=IDS)


def acting(s: str, allowed: str = "") -> list[str]:
    """Characters of ``s`` that act instead of showing (controls, format characters such as bidi
    overrides, surrogates, line separators, the XML-forbidden noncharacters), minus ``allowed``."""
    return [
        c
        for c in s
        if c not in allowed
        and (unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") or c in "\ufffe\uffff")
    ]


def hostile_report(name: str, check: bool = False):
    """A failing scan report (``check``: a failing check report) with ``name`` in every string
    field a renderer shows."""
    from nan_hunter.report import Diagnosis, FirstNonfinite, Report

    modules = [
        {
            "module": f"enc.{name}",
            "module_type": name,
            "call_index": 0,
            "input_index": 0,
            "depth": 1,
            "absmax": 3.0,
            "in_absmax": 1.0,
            "nan": 0,
            "posinf": 0,
            "neginf": 0,
        },
        {
            "module": name,
            "module_type": f"T{name}",
            "call_index": 0,
            "input_index": 0,
            "depth": 1,
            "absmax": 0.0,
            "in_absmax": 3.0,
            "nan": 0,
            "posinf": 4,
            "neginf": 0,
        },
    ]
    check_block = {
        "passed": False,
        "dtypes": ["fp16", name],
        "results": [
            {
                "rule": f"weights.{name}",
                "checkpoint": name,
                "status": "fail",
                "message": f"bad {name}",
                "dtype": "fp16",
                "value": None,
                "details": [f"fix: {name}"],
            },
            {
                "rule": "forward.fp16.headroom",
                "checkpoint": name,
                "status": "warn",
                "message": f"max at {name}",
                "dtype": "fp16",
                "value": 0.6,
                "details": [],
            },
        ],
        "runs": {
            "fp16": {
                "finite": False,
                "failed_inputs": [0],
                "n_inputs": 1,
                "cause": name,
                "absmax": 3.0,
                "absmax_module": name,
                "first_nonfinite": {"module": name, "op": name, "kind": "posinf"},
            }
        },
    }
    return Report(
        checkpoint={"path": name, "format": name, "n_tensors": 2, "bytes": 1000},
        weights={
            "n_tensors": 2,
            "nonfinite": [
                {
                    "name": name,
                    "dtype": name,
                    "shape": [2, 2],
                    "nan": 1,
                    "posinf": 0,
                    "neginf": 0,
                    "first_index": [0, 1],
                }
            ],
            "near_overflow": [
                {
                    "name": f"near.{name}",
                    "dtype": "float32",
                    "absmax": 6e4,
                    "overflows": [],
                    "headroom": {"fp16": 1.09},
                }
            ],
        },
        run={"dtype": "fp16", "device": name, "n_inputs": 1, "failed_inputs": [0]},
        first_nonfinite=FirstNonfinite(
            0, name, name, name, "posinf", "producer", source=f"{name}:3  x = {name}", tensor=name
        ),
        replay={
            "fp32": {"finite": True, "nan": 0, "posinf": 0, "neginf": 0, "absmax": 7e4, "rel_err": 0.0},
            "fp16": {"finite": False, "nan": 0, "posinf": 4, "neginf": 0, "absmax": None, "rel_err": None},
        },
        diagnosis=Diagnosis(
            "overflow",
            "fp16",
            name,
            name,
            f"overflow in {name}",
            [f"absmax at {name}", name],
            f"keep {name} in fp32",
        ),
        notes=[f"note {name}", name],
        near_misses=[
            {"kind": "near_overflow", "module": name, "message": f"{name} output is 92% of fp16 max"}
        ],
        modules=modules,
        check=check_block if check else None,
    )
