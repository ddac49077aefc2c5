"""render/rows.py's name shortener (issue 48 item 5, issue 44 item 6): whole components go one at a
time, the one nearest the middle of the name first, never the leaf nor the layer index (the index's
parent last), the cells left over given back, in time linear in the components (it enumerated every combination of runs once: 43 s
for one 285-character name). The rule written plainly, rebuilding the text after every drop, is
kept here as the reference; the two agree on every width of names of every shape."""

from __future__ import annotations

import random
import time

import pytest

from nan_hunter.render.rows import PARAMETER_LEAVES, cells, cut_middle, elided


def shown(parts: list[str], dropped: set[int], sep: str = ".") -> str:
    """``parts`` with each run of dropped components as one "…" (the separator after it taken)."""
    text = ""
    for i, p in enumerate(parts):
        if i in dropped:
            if i - 1 not in dropped:
                text += (sep if i else "") + "…"
        else:
            text += (sep if i and i - 1 not in dropped else "") + p
    return text


def reference(name: str, width: int, sep: str = ".") -> str | None:
    """The rule, plainly: order the components that may go by the distance of their centre (in
    cells) from the middle of the name (left first on a tie), the layer index's parent last; drop
    them in that order until the text fits, then give back those dropped before the last, latest
    first, each that still fits; else the leaf alone, if it fits and is shorter."""
    parts = name.split(sep)
    n = len(parts)
    if n < 2:
        return None
    leaf = 2 if n >= 3 and parts[-1] in PARAMETER_LEAVES else 1
    digits = [i for i, p in enumerate(parts[:-leaf]) if p.isdigit()]
    idx = digits[-1] if digits else None
    parent = idx - 1 if idx else None
    centre = {
        i: cells(sep.join(parts[:i])) + (cells(sep) if i else 0) + cells(parts[i]) / 2 for i in range(n)
    }
    mid = cells(name) / 2
    order = sorted(
        (i for i in range(n - leaf) if i not in (idx, parent)), key=lambda i: (abs(centre[i] - mid), i)
    )
    order += [parent] if parent is not None else []
    dropped: set[int] = set()
    for k, i in enumerate(order):
        dropped.add(i)
        if cells(shown(parts, dropped, sep)) <= width:
            for j in reversed(
                order[:k]
            ):  # then each dropped before that still fits comes back, outermost first
                if cells(shown(parts, dropped - {j}, sep)) <= width:
                    dropped.discard(j)
            return shown(parts, dropped, sep)
    alone = "…" + sep.join(parts[n - leaf :])
    return alone if cells(alone) <= width and cells(alone) < cells(name) else None


NAMES = [
    "model.language_model.layers.17.mlp.down_proj",
    "model.layers.3.mlp.down_proj.weight",
    "model.layers.11.feed_forward_network.output_projection_layer",
    "encoder.layer.11.attention.output.dense",
    "a.b.c.d.e.f.g",
    "model.layers.0.mlp.experts.12.down_proj.weight_scale_inv",
    "层.权重.很长的名字",
    "x.1.y.2.z.bias",
    "0.weight",
    "blocks.3.attn.qkv",
]


def _random_names(k: int) -> list[str]:
    rng = random.Random(48)
    words = ["model", "layers", "mlp", "down_proj", "q", "self_attn", "o", "experts", "weight", "bias", "层"]
    return [
        "".join(
            w + "."
            for w in (rng.choice(words + [str(rng.randrange(40))]) for _ in range(rng.randrange(1, 9)))
        )
        + rng.choice(words)
        for _ in range(k)
    ]


@pytest.mark.parametrize("name", NAMES + _random_names(60))
def test_same_answers_as_the_rule_written_plainly(name):
    for width in range(2, cells(name) + 1):
        assert elided(name, width) == reference(name, width), (name, width)


@pytest.mark.parametrize("name", NAMES + _random_names(60))
def test_whole_components_go_the_leaf_and_the_layer_index_stay(name):
    parts = name.split(".")
    leaf = ".".join(parts[-2:]) if len(parts) >= 3 and parts[-1] in PARAMETER_LEAVES else parts[-1]
    index = next((p for p in reversed(parts[: len(parts) - leaf.count(".") - 1]) if p.isdigit()), None)
    for width in range(2, cells(name) + 1):
        out = cut_middle(name, width)
        assert cells(out) <= width, (name, width, out)
        short = elided(name, width)
        if short is None:
            continue
        assert short.endswith(leaf), (name, width, short)
        kept = [t for t in short.replace("…", ".").split(".") if t]
        it = iter(parts)
        assert all(any(t == p for p in it) for t in kept), (name, width, short)  # whole components, in order
        if index is not None and short != "…" + leaf:
            assert index in kept, (name, width, short)


def test_the_component_nearest_the_middle_goes_first():
    assert (
        cut_middle("model.layers.11.feed_forward_network.output_projection_layer", 45)
        == "model.layers.11.…output_projection_layer"
    )
    assert cut_middle("model.language_model.layers.17.mlp.down_proj", 35) == "model.…layers.17.mlp.down_proj"
    assert cut_middle("encoder.layer.11.attention.output.dense", 26) == "encoder.layer.11.…dense"
    assert cut_middle("a.b.c.d.e.f.g", 12) == "a.b.c.…e.f.g"  # d, the middle one
    assert cut_middle("a.b.c.d.e.f.g", 7) == "a.…f.g"


def test_a_long_name_is_linear():
    """A 285-character name took 43 s when forms were enumerated and the quadratic version still
    built every run of a 5,000-component name (12.5 million): one pass now. The bound is generous
    (a loaded machine); quadratic work on 20,000 components would take minutes."""
    name = ".".join(
        ["model", "language_model"]
        + [f"block_{i}" for i in range(20)]
        + ["layers", "61"]
        + [f"sub_{i}" for i in range(15)]
        + ["mlp", "experts", "down_proj", "weight_scale_inv"]
    )
    assert len(name) >= 285
    for width in (40, 80, 120, 160, 240):
        out = cut_middle(name, width)
        assert cells(out) <= width and out.endswith("weight_scale_inv") and "61." in out
    long = ".".join(f"c{i}" for i in range(20_000)) + ".layers.3.mlp.down_proj.weight"
    t = time.perf_counter()
    for width in (80, 1_000, 50_000):
        out = cut_middle(long, width)
        assert (
            cells(out) <= width and out.endswith(".layers.3.mlp.down_proj.weight") and out.startswith("c0.")
        )
    assert time.perf_counter() - t < 20.0


def test_the_verdict_keeps_the_decisive_name():
    name = "model.layers.0.mlp.down_proj.weight_scale_inv"
    assert (
        cut_middle(name, 40) == "…layers.0.mlp.down_proj.weight_scale_inv"
    )  # mlp, model dropped; mlp given back
    assert cut_middle(name, 30) == "…0.…down_proj.weight_scale_inv"  # the index's parent last
    assert "weight_scale_inv" in PARAMETER_LEAVES


def test_the_weights_verdict_line_names_the_weight_whole():
    """issue 48: "first …0.…weight_scale_inv" at any width; now the quantized weight the diagnosis names
    (``param``), whole, and a non-finite tensor by its name, in 79 cells."""
    from nan_hunter.render.rows import verdict
    from nan_hunter.report import Diagnosis, Report

    w = "model.layers.0.mlp.down_proj.weight"
    rep = Report(
        weights={"nonfinite": [{"name": w + "_scale_inv"}]},
        diagnosis=Diagnosis(
            "bad_scale", None, None, None, "quantized weight ... has a Inf scale", [], "fix", param=w
        ),
    )
    assert verdict(rep).text == f"✘ bad_scale: bad scale in {w}"
    rep = Report(
        weights={"nonfinite": [{"name": "model.layers.11.self_attn.q_norm.weight"}, {"name": "b"}]},
        diagnosis=Diagnosis(
            "nonfinite_weights",
            None,
            None,
            None,
            "s",
            [],
            "fix",
            param="model.layers.11.self_attn.q_norm.weight",
        ),
    )
    line = verdict(rep).text
    assert "model.layers.11.self_attn.q_norm.weight" in line and cells(line) <= 79
