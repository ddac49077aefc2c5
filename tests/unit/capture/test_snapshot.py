"""nan_hunter/capture/snapshot.py: a root forward's arguments kept for a later re-run."""

from __future__ import annotations

import torch

from nan_hunter.capture.snapshot import Snapshot


class Cache:
    def __init__(self, t):
        self.layers = [t]


def test_tensors_are_kept_by_reference_until_pinned():
    x = torch.ones(2)
    s = Snapshot.of((x,), {"k": 3})
    assert s.args[0] is x and s.kwargs == {"k": 3} and not s.pinned
    s.pin()
    assert s.pinned and s.args[0] is not x and torch.equal(s.args[0], x)
    x.add_(1)  # pinned: later in-place changes are not seen
    assert torch.equal(s.args[0], torch.ones(2))


def test_in_place_changes_before_pin_are_counted():
    x, y = torch.ones(2), torch.ones(2)
    s = Snapshot.of((x, y), {})
    assert s.changed_since() == 0
    x.mul_(2)
    assert s.changed_since() == 1
    s.pin()
    assert s.changed == 1 and s.changed_since() == 1
    assert torch.equal(s.args[0], torch.full((2,), 2.0))  # the value as it is now


def test_rerun_gives_a_fresh_copy_each_time():
    cache = Cache(torch.zeros(1))
    s = Snapshot.of((torch.ones(2),), {"past": cache})
    a1, k1 = s.rerun()
    a2, _ = s.rerun()
    a1[0].fill_(5)
    assert torch.equal(a2[0], torch.ones(2)) and torch.equal(s.args[0], torch.ones(2))
    k1["past"].layers.append(torch.ones(1))  # growing the re-run's cache leaves the user's alone
    assert len(cache.layers) == 1 and s.kwargs["past"] is not cache


def test_inference_tensors_are_kept_without_a_version():
    with torch.inference_mode():
        t = torch.ones(2)
    s = Snapshot.of((t,), {})
    assert s.versions == [] and s.changed_since() == 0
