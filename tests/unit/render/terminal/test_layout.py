"""Terminal layout: names shortened in the middle, numbers never cut, wrapped lines indented,
every line within the console's width."""

from __future__ import annotations

import io
import re

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from nan_hunter.render.terminal import render
from nan_hunter.render.terminal.layout import Col, fit, shorten_middle, wrap
from nan_hunter.report import Diagnosis, FirstNonfinite, Report

LONG = "model.language_model.layers.17.mlp.down_proj"


@pytest.mark.parametrize(
    ("name", "width", "shown"),
    [
        (LONG, 100, LONG),
        (LONG, 30, "model.…layers.17.mlp.down_proj"),
        (LONG, 24, "…layers.17.mlp.down_proj"),
        (
            LONG,
            20,
            "model.…17.…down_proj",
        ),  # issue 44: mlp (nearest the middle) before model; model given back
        # issue 32 (6): the layer index stays, whole components go from the middle (once:
        # "…eed_forward_network.output_projection_layer", the index lost and a word cut)
        (
            "model.layers.11.feed_forward_network.output_projection_layer",
            45,
            "model.layers.11.…output_projection_layer",
        ),
        (
            "model.layers.11.feed_forward_network.output_projection_layer",
            36,
            "…layers.11.…output_projection_layer",
        ),
        ("encoder.layer.11.attention.output.dense", 30, "encoder.layer.11.…output.dense"),
        ("encoder.layer.11.attention.output.dense", 20, "…layer.11.…dense"),
        ("model.layers.3.mlp.down_proj.weight", 28, "…layers.3.…down_proj.weight"),
        ("model.layers.3.mlp.down_proj.weight", 24, "…3.mlp.down_proj.weight"),
        ("model.this_is_an_extremely_long_leaf_module_name", 20, "…ng_leaf_module_name"),
        ("层.权重.很长的名字", 11, "…很长的名字"),  # two cells per character
    ],
)
def test_shorten_middle_keeps_the_layer_index_and_the_leaf(name, width, shown):
    out = shorten_middle(name, width)
    assert out == shown and cell_len(out) <= width


def test_wrap_never_cuts_a_number_or_an_index():
    text = "decoder.weight (bfloat16 [16, 8]): 0 NaN, 1 +inf, 1 −inf, first at [5, 1] absmax 1.234e+05"
    for width in range(24, 90):
        lines = wrap(text, width)
        assert all(cell_len(x) <= width for x in lines)
        assert " ".join(lines) == text  # broken only at spaces
        assert all("[5, 1]" in x for x in lines if "[5" in x) and any("1.234e+05" in x for x in lines)


def test_fit_gives_numbers_their_width_and_drops_optional_columns():
    name = Col("module", [Text(LONG)], "name", low=20)
    kind = Col("type", [Text("LlamaDecoderLayer")], "end", low=10, optional=True)
    nums = [Col(h, [Text("1.234e+05")], justify="right") for h in ("absmax", "headroom")]
    assert fit([name, kind, *nums], 200) == [len(LONG), 17, 9, 9]
    assert fit([name, kind, *nums], 60) == [40, 0, 9, 9]  # the name first; no room left for the type
    assert fit([name, kind, *nums], 62, order=[(0, 30), (1, None)]) == [
        30,
        11,
        9,
        9,
    ]  # type shown at its stage
    assert fit([name, kind, *nums], 40) == [20, 0, 9, 9]


def _deep_report(n_layers: int = 24, bad: int = 17) -> Report:
    rows = []
    for i in range(n_layers):
        for leaf, t in (
            ("self_attn.q_proj", "Linear"),
            ("post_attention_layernorm", "LlamaRMSNorm"),
            ("mlp.down_proj", "Linear"),
        ):
            rows.append(
                {
                    "module": f"model.language_model.layers.{i}.{leaf}",
                    "module_type": t,
                    "call_index": 0,
                    "input_index": 0,
                    "depth": 3 + leaf.count("."),
                    "absmax": 123456.7 / (1 + i) / 3,
                    "in_absmax": 2.5,
                    "nan": 0,
                    "posinf": 0,
                    "neginf": 0,
                }
            )
    prod = next(i for i, r in enumerate(rows) if r["module"].endswith(f"{bad}.mlp.down_proj"))
    rows[prod].update(absmax=0.0, posinf=12)
    name = rows[prod]["module"]
    ev = [
        f"absmax 7.654e+04 > fp16 max 65504 at aten.mm.default in {name}; finite in fp32, bf16",
        "operands finite: absmax 311.2, 246.1 in the rows of the input at index [3, 1017]",
    ]
    return Report(
        checkpoint={
            "path": "/data/checkpoints/run-42/model.safetensors",
            "format": "safetensors",
            "n_tensors": 290,
            "bytes": 2_400_000_000,
        },
        run={"dtype": "fp16", "device": "cpu", "n_inputs": 1, "failed_inputs": [0]},
        modules=rows,
        first_nonfinite=FirstNonfinite(
            0,
            name,
            "Linear",
            "aten.mm.default",
            "posinf",
            "producer",
            source="modeling_llama.py:176  down = self.down_proj(x)",
        ),
        diagnosis=Diagnosis(
            "overflow",
            "fp16",
            name,
            "aten.mm.default",
            "a matmul overflows fp16",
            ev,
            "keep the MLP down projection in fp32 or run in bf16 (wide range)",
        ),
        notes=["a note long enough to wrap: " + "the quick brown fox jumps over the lazy dog " * 3],
    )


def _render(rep: Report, width: int) -> list[str]:
    buf = io.StringIO()
    render(rep, Console(file=buf, width=width), strip=True)  # a file: a pipe, no colour
    return buf.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 100])
def test_report_fits_and_keeps_numbers_and_tails(width):
    lines = _render(_deep_report(), width)
    assert all(cell_len(x) <= width for x in lines), max(lines, key=cell_len)
    strip = [x for x in lines if "█" in x]
    # every absmax the strip shows is whole (4 significant digits) and right-aligned before the headroom
    shown = {x.split()[-2] for x in strip if "+inf" not in x}
    rows = _deep_report().modules
    assert shown and shown <= {f"{r['absmax']:.4g}" for r in rows}
    prod = next(x for x in lines if x.startswith("▶"))
    assert "17.mlp.down_proj" in prod and "+inf" in prod
    assert all("…" not in x.split()[-1] and "…" not in x.split()[-2] for x in strip)  # numbers never cut


def test_headroom_strip_is_readable_at_100_columns():
    lines = _render(_deep_report(), 100)
    header = next(x for x in lines if "absmax" in x and "headroom" in x and "module" in x)
    assert "type" in header  # room for the type column
    bars = [x for x in lines if "█" in x]
    assert bars and min(x.count("█") + x.count("·") for x in bars) >= 20
    assert any("layers.17.mlp.down_proj" in x for x in lines if x.startswith("▶"))


def test_wrapped_bullets_and_notes_indent_under_their_text():
    lines = _render(_deep_report(), 80)
    i = next(i for i, x in enumerate(lines) if "•" in x and "absmax 7.654e+04" in x)
    col = lines[i].index("absmax")
    cont = lines[i + 1]
    assert cont[:col].strip("│ ") == "" and cont[col] != " "  # continuation starts under the text
    j = next(i for i, x in enumerate(lines) if x.startswith("note"))
    assert lines[j + 1].startswith(" " * lines[j].index("a note")) and lines[j + 1].strip()


def test_one_shortening_style_in_a_strip():
    """issue 32 (6): every shortened name of a strip has the same shape — the layer index as a whole
    component, "…" for whole components only, the leaf whole — never the front cut off at one row
    and the middle at the next."""
    names = [
        f"model.layers.{i}.{leaf}"
        for i in (1, 11)
        for leaf in ("self_attn.q_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.down_proj")
    ]
    for width in (28, 30, 32, 36):
        for n in names:
            s = shorten_middle(n, width)
            i, leaf = n.split(".")[2], n.split(".")[-1]
            assert cell_len(s) <= width and re.search(rf"[.…]{leaf}$", s), (n, width, s)  # the leaf, whole
            assert re.search(rf"(^|[.…]){i}\.", s), (n, width, s)  # the index, whole
            pieces = [p for p in re.split(r"[.…]", s) if p]
            assert all(p in n.split(".") for p in pieces), (n, width, s)  # no component cut inside
