"""errors.py: ``BadInput`` is one line whatever came in with a name (control characters and line
separators escaped), install hints point at the clone, ``NonFiniteError`` carries the report."""

from __future__ import annotations

import pytest

from nan_hunter.errors import BadInput, NonFiniteError, install_hint


@pytest.mark.parametrize(
    "name, shown",
    [
        ("plain.safetensors", "plain.safetensors"),
        ("a\nb", "a\\nb"),
        ("tab\there", "tab\\there"),
        ("esc\x1b[2J", "esc\\x1b[2J"),
        ("del\x7f", "del\\x7f"),
        ("c1\x85", "c1\\x85"),
        ("ls\u2028ps\u2029", "ls\\u2028ps\\u2029"),
        ("bidi\u202e ok", "bidi\u202e ok"),  # not a line break: left to the terminal view's escaping
    ],
)
def test_bad_input_is_one_line(name, shown):
    e = BadInput(f"shard {name} is missing")
    assert str(e) == f"shard {shown} is missing" and "\n" not in str(e)


def test_bad_input_takes_any_message_object():
    assert str(BadInput(3)) == "3" and str(BadInput()) == ""


@pytest.mark.parametrize("extra", ["hf", "plot", "accelerate", "lightning", "gpu"])
def test_install_hint(extra):
    assert install_hint(extra) == f"pip install -e '.[{extra}]' in the nanhunter clone"


def test_non_finite_error_carries_the_report():
    rep = object()
    e = NonFiniteError(rep, "NaN in layers.0")
    assert isinstance(e, RuntimeError) and e.report is rep and str(e) == "NaN in layers.0"
