"""``--device-map``/``--max-memory`` parsing (``nan_hunter.model.placement``): sizes, devices, errors."""

from __future__ import annotations

import pytest

from nan_hunter.errors import BadInput
from nan_hunter.model.placement import Placement, parse, parse_size


@pytest.mark.parametrize(
    "text, n",
    [
        ("200MB", 200 * 10**6),
        ("1.5GiB", 3 * 2**29),
        ("4096", 4096),
        ("300 kb", 300_000),
        ("2TiB", 2 * 2**40),
        ("7B", 7),
    ],
)
def test_sizes(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "MB", "-1MB", "1e3MB", "12 parsecs", "0", "0.0001B"])
def test_bad_sizes(text):
    with pytest.raises(BadInput):
        parse_size(text)


def test_devices_and_defaults():
    pytest.importorskip("accelerate")
    assert parse(None, None) is None
    assert parse("auto", None) == Placement("auto", ())
    assert parse("auto", ["CPU=200MB"]) == Placement("auto", (("cpu", 200 * 10**6),))


@pytest.mark.parametrize(
    "device_map, mm, message",
    [
        (None, ["cpu=1GB"], "needs --device-map auto"),
        ("balanced", None, "only auto"),
        ("auto", ["cpu"], "DEVICE=SIZE"),
        ("auto", ["=1GB"], "DEVICE=SIZE"),
        ("auto", ["npu=1GB"], "not understood"),
        ("auto", ["cpu=1GB", "cpu=2GB"], "given twice"),
        ("auto", ["cuda:0=1GB", "0=2GB"], "given twice"),
    ],
)
def test_bad_options(device_map, mm, message):
    with pytest.raises(BadInput, match=message):
        parse(device_map, mm)
