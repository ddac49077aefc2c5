"""render/help.py: the Examples panel under a command's ``--help``: each example's purpose as a
comment, then the command line exactly as typed (never re-wrapped inside)."""

from __future__ import annotations

import io

from rich.console import Console

from nan_hunter.render.help import examples_text, print_examples

EXAMPLES = [
    ("scan a checkpoint", "nanhunter scan model.safetensors"),
    ("keep a module in fp32", "nanhunter bisect model.safetensors --dtype fp16 --policy-out p.yaml"),
]


def test_examples_text_is_comment_then_command():
    assert examples_text(EXAMPLES).plain == (
        "# scan a checkpoint\nnanhunter scan model.safetensors\n\n"
        "# keep a module in fp32\n"
        "nanhunter bisect model.safetensors --dtype fp16 --policy-out p.yaml"
    )


def test_no_examples_is_empty():
    assert examples_text([]).plain == ""


def test_panel_titled_examples_and_commands_kept_whole():
    buf = io.StringIO()
    print_examples(EXAMPLES, Console(file=buf, width=120, color_system=None))
    out = buf.getvalue()
    assert out.splitlines()[0].startswith("╭─ Examples ")
    assert "nanhunter bisect model.safetensors --dtype fp16 --policy-out p.yaml" in out
