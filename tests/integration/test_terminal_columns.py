"""The terminal view of a real scan at 80 columns and in a pipe: every line fits, module names
are shortened in the middle so the distinguishing tail stays, numbers are never cut, the
headroom strip is readable at 100 columns, wrapped bullets indent.

The model: a 20-layer Llama built from a tiny config (transformers), whose layer 17 MLP
overflows fp16 at its down projection.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.cells import cell_len

LAYERS, HOT = 20, 17


@pytest.fixture(scope="module")
def llama20(tmp_path_factory) -> dict[str, str]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("llama20")
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    mlp = model.model.layers[HOT].mlp
    with torch.no_grad():  # gate·up reach ~16 per channel; 32 channels x 3e4 overflow fp16 (65504)
        mlp.gate_proj.weight.fill_(1.0)
        mlp.up_proj.weight.fill_(1.0)
        mlp.down_proj.weight.fill_(3e4)
    model.save_pretrained(d, safe_serialization=True)
    save_file({"input_ids": torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])}, str(d / "inputs.safetensors"))
    return {"dir": str(d), "inputs": str(d / "inputs.safetensors")}


@pytest.fixture(scope="module")
def at80(llama20, tmp_path_factory, run_main) -> tuple[list[str], dict]:
    """The real command at COLUMNS=80 with stdout a pipe: its lines and its JSON report."""
    import json

    jp = tmp_path_factory.mktemp("json") / "r.json"
    res = run_main(
        "scan",
        llama20["dir"],
        "--inputs",
        llama20["inputs"],
        "--dtype",
        "fp16",
        "--json",
        jp,
        env={"COLUMNS": "80"},
    )
    assert res.code == 1, res.stderr
    return res.stdout.splitlines(), json.loads(Path(jp).read_text())


@pytest.fixture(scope="module")
def report(llama20):
    """The same scan through the Python API, to render at other widths."""
    import nan_hunter

    return nan_hunter.scan(llama20["dir"], inputs=[llama20["inputs"]], dtype="fp16")


def _render(rep, width: int | None) -> list[str]:
    """The terminal view into a file (as into a pipe); ``width`` None: rich's own default."""
    import io

    from rich.console import Console

    from nan_hunter.render.terminal import render

    buf = io.StringIO()
    render(rep, Console(file=buf, width=width), strip=True)
    return buf.getvalue().splitlines()


def _strip_lines(lines: list[str]) -> list[str]:
    return [x for x in lines if "█" in x]


def test_every_line_fits_80_columns(at80, report, monkeypatch):
    lines, rep = at80
    assert rep["first_nonfinite"]["module"] == f"model.layers.{HOT}.mlp.down_proj"
    assert all(cell_len(x) <= 80 for x in lines), max(lines, key=cell_len)
    assert not any("\x1b" in x for x in lines)  # a pipe: no colour codes
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe without COLUMNS is 80 columns too
    assert max(cell_len(x) for x in _render(report, None)) == 80  # the panels span exactly the 80 columns


def test_names_keep_their_tail_and_numbers_stay_whole(at80):
    lines, rep = at80
    names = {m["module"] or "<root>" for m in rep["modules"]}
    absmax = {f"{m['absmax']:.4g}" for m in rep["modules"] if m["absmax"] is not None}
    strip = _strip_lines(lines)
    assert len(strip) >= 20
    for x in strip:
        cells = x.lstrip("▶ ").split()
        shown = cells[0]
        assert shown in names or (
            shown.startswith(("…", "model.…")) and any(n.endswith(shown.split("…")[1]) for n in names)
        ), shown
        number, head = cells[-2], cells[-1]
        assert number in absmax or number in ("NaN", "+inf", "−inf"), x
        assert re.fullmatch(r"[0-9.e+]+x|∞|—", head), x
    prod = next(x for x in strip if x.startswith("▶"))
    assert f"{HOT}.mlp.down_proj" in prod and re.search(r"(NaN|\+inf|−inf)\s+—$", prod)


def test_wrapped_bullets_indent(at80):
    lines, _ = at80
    i = next(i for i, x in enumerate(lines) if "•" in x and len(x.rstrip(" │")) > 60)
    text_col = re.search(r"•\s+", lines[i]).end()
    follow = lines[i + 1]
    assert follow.startswith("│") and follow[1:text_col].strip() == "" and follow[text_col] != " ", (
        lines[i],
        follow,
    )


def test_headroom_strip_is_readable_at_100_columns(report):
    lines = _render(report, 100)
    assert all(cell_len(x) <= 100 for x in lines)
    strip = _strip_lines(lines)
    assert min(x.count("█") + x.count("·") for x in strip) >= 20  # bars of 20+ cells
    header = next(x for x in lines if x.split()[:1] == ["module"])
    assert "type" in header and "absmax" in header and "headroom" in header
    assert any(f"model.layers.{HOT}.mlp.down_proj" in x for x in strip)  # room for the whole name
