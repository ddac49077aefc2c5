"""render/diff_view.py: ``nanhunter diff`` in the terminal — the verdict first, the environment
keys that differ, the first divergence's statistics; every line ≤ 80 columns and every string from
a trace escaped."""

from __future__ import annotations

import pytest

from nan_hunter.render.diff_view import WIDTH, lines, render

from .diffs import ENV, agreeing, diverging, one_side_nonfinite

HOSTILE = "evil\x1b[2J\u202e" + "x" * 120


@pytest.mark.parametrize(
    "make, first",
    [
        (diverging, "✘ runs part at mid (M) · aten.exp.default"),
        (agreeing, "✔ no divergence: 2 entries agree within tolerance (max rel_err 0)"),
        (one_side_nonfinite, "✘ only B is non-finite: posinf first at m · aten.exp.default"),
    ],
)
def test_verdict_first(tmp_path, make, first):
    out = lines(make(tmp_path).to_dict())
    assert out[0] == first
    assert all(len(line) <= WIDTH for line in out)


def test_the_divergence_block(tmp_path):
    out = render(diverging(tmp_path, env_b={**ENV, "threads": 1}).to_dict()).splitlines()
    assert out[1] == "  outputs differ: rel_err 2.00e-01 > 1.0e-03"
    assert out[2] == "  environment differs: threads"
    at = out.index("first divergence  mid (M)")
    assert out[at + 1 : at + 5] == [
        "  call 0 · input 0 · step 0 · forward",
        "  op      aten.exp.default",
        "  source  model.py:1",
        "  rel_err 2.00e-01 > tolerance 1.0e-03 · inputs agree",
    ]
    assert out[at + 6].split()[:2] == ["A", "2.000e+00"] and out[at + 7].split()[:2] == ["B", "2.500e+00"]
    assert "  threads   2 | 1" in out
    assert out[-1] == "compared 2 ops-level entries · unmatched A 0 · B 0"


def test_same_environment_and_unmatched_entries_are_said(tmp_path):
    out = lines(one_side_nonfinite(tmp_path).to_dict())
    assert (
        out[1] == "  outputs bitwise equal: the divergence did not reach them"
    )  # B's extra op is not an output
    assert out[2] == "  environment: the same"
    assert "                  B: posinf at m aten.exp.default (#1)" in out
    assert any(line.startswith("note: 0 entries of A and 1 of B have no counterpart") for line in out)


def test_many_environment_keys_fit_one_line_and_twelve_rows(tmp_path):
    env_b = {**ENV, **{f"knob_{i:02d}": i for i in range(20)}}
    out = lines(diverging(tmp_path, env_b=env_b).to_dict())
    assert out[2].startswith("  environment differs: knob_00, knob_01") and out[2].endswith(" more")
    assert len(out[2]) <= WIDTH
    assert "  … 8 more (see --json)" in out


def test_strings_from_traces_are_escaped_and_cut(tmp_path):
    out = lines(diverging(tmp_path, module=HOSTILE).to_dict())
    text = "\n".join(out)
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b" in text
    assert out[0].startswith("✘ runs part at evil\\x1b[2J") and "…" in out[0] and len(out[0]) == WIDTH


def test_render_ends_lines_without_trailing_spaces(tmp_path):
    text = render(agreeing(tmp_path).to_dict())
    assert text.endswith("\n") and all(line == line.rstrip() for line in text.splitlines())


def test_a_printable_diff_prints_the_terminal_view_and_repr_stays_short(tmp_path):
    from nan_hunter.render.diff_view import PrintableDiff, printable

    res = diverging(tmp_path)
    shown = printable(res)
    assert isinstance(shown, PrintableDiff)
    assert str(shown) == render(res.to_dict())
    assert shown.to_dict() == res.to_dict()
    assert len(repr(res)) < 400 and "exit 1" in repr(res)


def test_environment_rows_line_up_under_their_header(tmp_path):
    env_b = {**ENV, "threads": 1, "a_much_longer_setting_name": "on"}
    out = lines(diverging(tmp_path, env_b=env_b).to_dict())
    head = next(i for i, line in enumerate(out) if line.startswith("environment "))
    block = [out[head]] + [line for line in out[head + 1 :] if line.startswith("  ") and " | " in line]
    assert len(block) >= 3
    assert len({line.index(" | ") for line in block}) == 1
    assert len({line.index("A") if i == 0 else None for i, line in enumerate(block)} - {None}) == 1
