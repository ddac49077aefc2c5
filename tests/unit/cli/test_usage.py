"""cli/usage.py: click's usage errors in the one line nanhunter has always printed (argparse's
wording), with a suggestion for a mistyped option or command and the help to read."""

from __future__ import annotations

import pytest

from nan_hunter.cli.app import PROG, build_command
from nan_hunter.cli.usage import click_exceptions, describe, usage_line


def _error(*argv: str):
    """The usage error click raises for ``nanhunter ARGV``, as ``main`` meets it (parsing fails
    before any command runs)."""
    exc = click_exceptions()
    group = build_command()
    try:
        with group.make_context(PROG, list(argv)) as ctx:
            group.invoke(ctx)
    except exc.UsageError as e:
        return e
    raise AssertionError(f"{argv} parsed")


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["scan", "x", "--dtpye", "fp16"],
            "nanhunter: error: unrecognized arguments: --dtpye; did you mean --dtype? (see `nanhunter scan --help`)",
        ),
        (
            ["scan", "x", "--html", "r.html"],  # the project's synonym
            "nanhunter: error: unrecognized arguments: --html; did you mean --report? (see `nanhunter scan --help`)",
        ),
        (
            ["scan", "x", "--zzzzzz"],
            "nanhunter: error: unrecognized arguments: --zzzzzz (see `nanhunter scan --help`)",
        ),
        (
            ["scan"],
            "nanhunter: error: the following arguments are required: checkpoint (see `nanhunter scan --help`)",
        ),
        (
            ["diff"],
            "nanhunter: error: the following arguments are required: A, B (see `nanhunter diff --help`)",
        ),
        (
            ["diff", "a"],
            "nanhunter: error: the following arguments are required: B (see `nanhunter diff --help`)",
        ),
        (
            ["bisect", "x", "--rtol", "abc"],
            "nanhunter: error: argument --rtol: invalid float value: 'abc' (see `nanhunter bisect --help`)",
        ),
        (
            ["scan", "x", "--dtype"],
            "nanhunter: error: argument --dtype: expected one argument (see `nanhunter scan --help`)",
        ),
        (
            ["scan", "x", "--quiet=yes"],
            "nanhunter: error: argument --quiet: ignored explicit argument 'yes' (see `nanhunter scan --help`)",
        ),
        (["scan", "x", "y"], "nanhunter: error: unrecognized arguments: y (see `nanhunter scan --help`)"),
    ],
)
def test_usage_lines(argv, line):
    assert usage_line(_error(*argv), argv) == line


@pytest.mark.parametrize(
    "typed, says",
    [
        (
            "sacn",
            "argument COMMAND: invalid choice: 'sacn' (choose from 'scan', 'bisect', 'check', 'diff'); did you "
            "mean scan?",
        ),
        (
            "frobnicate",
            "argument COMMAND: invalid choice: 'frobnicate' (choose from 'scan', 'bisect', 'check', 'diff')",
        ),
    ],
)
def test_unknown_command(typed, says):
    assert describe(_error(typed), [typed]) == says


def test_an_error_without_a_context_names_the_command_typed():
    exc = click_exceptions()
    e = exc.UsageError("Something odd")
    assert usage_line(e, ["check", "x"]) == "nanhunter: error: something odd (see `nanhunter check --help`)"
    assert usage_line(e, ["--bogus"]) == "nanhunter: error: something odd (see `nanhunter --help`)"
