"""nan_hunter/capture/snapshot.py: a root forward's arguments kept for a later re-run."""

from __future__ import annotations

import pytest
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


def test_a_kv_cache_taken_after_the_forward_is_cropped_back_to_its_length_before():
    """The sentinel keeps a failing decode step's inputs at its end: ``cropped`` copies them and
    removes what the step appended to its cache, so the copy equals one taken before it ran."""
    pytest.importorskip("transformers")
    from transformers import DynamicCache

    cache = DynamicCache()
    k = torch.randn(1, 2, 3, 4)
    cache.update(k, k + 1, 0)
    ids = torch.tensor([[5]])
    lengths = Snapshot.cache_lengths((), {"input_ids": ids, "past_key_values": cache, "use_cache": True})
    assert lengths == {"past_key_values": 3}
    before = Snapshot.of((), {"input_ids": ids, "past_key_values": cache}).rerun()[1]["past_key_values"]
    cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), 0)  # the step appends its token
    snap = Snapshot.cropped((), {"input_ids": ids, "past_key_values": cache}, lengths)
    after = snap.rerun()[1]["past_key_values"]
    assert cache.get_seq_length() == 4 and after.get_seq_length() == 3  # the user's cache untouched

    def kv(c):  # layer 0's keys and values: ``layers`` from transformers 4.54 on, key/value_cache before
        return (
            (c.layers[0].keys, c.layers[0].values)
            if hasattr(c, "layers")
            else (c.key_cache[0], c.value_cache[0])
        )

    assert all(torch.equal(a, b) for a, b in zip(kv(after), kv(before)))
    assert Snapshot.cache_lengths(([1, 2],), {}) is None  # a container: taken before the forward
