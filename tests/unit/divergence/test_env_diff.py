"""divergence/env_diff.py: the environment keys two traces differ in, flattened to dotted keys,
in A's order then B's, a key absent on one side as None, where-the-file-came-from keys ignored."""

from __future__ import annotations

import pytest

from nan_hunter.divergence.env_diff import IGNORED, env_diff, flatten


@pytest.mark.parametrize(
    "env, flat",
    [
        ({}, {}),
        ({"threads": 2}, {"threads": 2}),
        (
            {"versions": {"torch": "2.13", "python": "3.11"}},
            {"versions.torch": "2.13", "versions.python": "3.11"},
        ),
        ({"a": {"b": {"c": 1}}}, {"a.b.c": 1}),
        ({"tf32": {}}, {"tf32": {}}),  # an empty dict is a value
        ({"devices": [0, 1]}, {"devices": [0, 1]}),  # lists stay values
        ({"created": "today", "command": ["x"], "device": "cpu"}, {"device": "cpu"}),
    ],
)
def test_flatten(env, flat):
    assert flatten(env) == flat


def test_ignored_keys():
    assert IGNORED == {"created", "command"}


def test_env_diff_order_and_absent_keys():
    a = {"threads": 1, "versions": {"torch": "2.13"}, "device": "cpu", "only_a": True}
    b = {"device": "cpu", "versions": {"torch": "2.14"}, "threads": 2, "only_b": 3, "created": "now"}
    assert env_diff(a, b) == [
        {"key": "threads", "a": 1, "b": 2},
        {"key": "versions.torch", "a": "2.13", "b": "2.14"},
        {"key": "only_a", "a": True, "b": None},
        {"key": "only_b", "a": None, "b": 3},
    ]


def test_the_same_environment():
    env = {"threads": 2, "versions": {"torch": "2.13"}}
    assert env_diff(env, dict(env)) == [] and env_diff(env, {**env, "created": "later"}) == []
