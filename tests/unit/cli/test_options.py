"""cli/options.py: shared flags declared once — help that states its default (brackets escaped
for rich), numbers converted with argparse's refusal, the parsed flags as a namespace (a
repeatable flag not given is None; the command line rides along), ``--trace`` as an output."""

from __future__ import annotations

import pytest
import typer

from nan_hunter.cli import options as o
from nan_hunter.outputs import Output


@pytest.mark.parametrize(
    "text, default, shown",
    [
        ("the run's dtype", None, "the run's dtype"),
        ("tolerance", 0.01, "tolerance (default: 0.01)"),
        ("the backend", "inductor", "the backend (default: inductor)"),
        ("fast or full (default: fast)", "fast", "fast or full (default: fast)"),  # already said: not twice
        ("a flag", True, "a flag"),  # booleans are flags: no default shown
        ("a [list]", None, "a \\[list]"),  # typer reads help as rich markup
    ],
)
def test_help_states_the_default(text, default, shown):
    assert o.opt("--x", help=text, default=default).help == shown


class _Ctx:
    resilient_parsing = False


@pytest.mark.parametrize("kind, value, want", [(float, "1e-3", 1e-3), (int, "7", 7), (float, None, None)])
def test_number_converts(kind, value, want):
    assert o.number(kind, "--rtol")(_Ctx(), None, value) == want


@pytest.mark.parametrize(
    "kind, value, says",
    [(float, "abc", "invalid float value: 'abc'"), (int, "1.5", "invalid int value: '1.5'")],
)
def test_number_refuses_as_argparse_did(kind, value, says):
    with pytest.raises(typer.BadParameter, match=says):
        o.number(kind, "--generate")(_Ctx(), None, value)


def test_number_leaves_values_alone_while_completing():
    ctx = _Ctx()
    ctx.resilient_parsing = True
    assert o.number(float, "--rtol")(ctx, None, "abc") == "abc"
    assert o.number(float, "--rtol").__name__ == "float_rtol"


def test_namespace():
    o.COMMAND_LINE = ["nanhunter", "scan", "x"]
    args = o.namespace({"checkpoint": "x", "prompt": [], "inputs": ["a", "b"], "quiet": True})
    assert (args.checkpoint, args.prompt, args.inputs, args.quiet) == ("x", None, ["a", "b"], True)
    assert args.argv == ["nanhunter", "scan", "x"] and o.STARTED is True


@pytest.mark.parametrize(
    "trace, outs", [(None, []), ("run.jsonl", [Output("--trace", "run.jsonl", text=False)])]
)
def test_trace_output(trace, outs):
    class Args:
        pass

    a = Args()
    a.trace = trace
    assert o.trace_output(a) == outs


def test_panels_in_help_order():
    assert o.PANELS == (o.MODEL, o.INPUTS, o.RUN, o.MODE, o.OUTPUT)
    assert o.examples(("a", "b"), ("c", "d")) == [("a", "b"), ("c", "d")]


def test_command_is_generated_from_the_option_fields():
    """One parameter per option field, in help order, the outputs as given; called from Python, a
    flag not given takes its default, and ``run`` gets the parsed flags."""
    import inspect
    from dataclasses import dataclass

    from nan_hunter.options import Panel, option

    @dataclass(frozen=True)
    class Opts:
        steps: int | None = option(
            None, "--max-steps", metavar="N", panel=Panel.MODE, number=int, help="stop after N"
        )
        name: str = option("x", "--name", metavar="NAME", panel=Panel.MODEL, help="a name")
        fast: bool = option(True, "--no-fast", panel=Panel.MODE, inverted=True, help="slowly")
        prompts: tuple[str, ...] = option(
            (),
            "--prompt",
            metavar="TEXT",
            panel=Panel.INPUTS,
            repeatable=True,
            param="prompt",
            help="text (repeatable)",
        )

    seen = []
    cmd = o.command(Opts, seen.append, [("checkpoint", o.Checkpoint)], [("quiet", o.Quiet, False)])
    params = inspect.signature(cmd).parameters
    assert list(params) == ["checkpoint", "name", "prompt", "max_steps", "no_fast", "quiet"]
    assert [params[n].default for n in params][1:] == ["x", None, None, False, False]
    cmd("ck", max_steps="3")
    args = seen[0]
    assert (args.checkpoint, args.name, args.max_steps, args.no_fast, args.prompt) == (
        "ck",
        "x",
        "3",
        False,
        None,
    )
    from nan_hunter.options import values_from_cli

    assert values_from_cli(Opts, args) == {"name": "x", "steps": "3"}
