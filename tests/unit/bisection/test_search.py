"""The pure precision-bisection search (nan_hunter.bisection.search) against synthetic predicates."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nan_hunter.bisection.search import (
    PrecisionSearch,
    SearchResult,
    minimal_keep_set,
    run_bound,
)

ROOT = Path(__file__).resolve().parents[3]


def names(n: int) -> list[str]:
    return [f"layers.{i}" for i in range(n)]


class Oracle:
    """A monotone predicate: passes iff ``keep`` contains one of ``terms`` (a monotone DNF).

    One term of several names = AND semantics; several one-name terms = OR semantics.
    ``producer`` decides what a failing run reports as its first NaN producer:
    ``none``; ``first`` (the first culprit, in execution order, that is not kept: a NaN that
    moves downstream as producers are kept); ``random`` (any name not kept: misleading);
    ``liar`` (the first non-culprit not kept: always wrong).
    """

    def __init__(
        self,
        candidates: list[str],
        terms: Iterable[Iterable[str]],
        producer: str = "none",
        rng: random.Random | None = None,
    ) -> None:
        self.candidates = candidates
        self.terms = [frozenset(t) for t in terms]
        self.culprits = frozenset().union(*self.terms) if self.terms else frozenset()
        self.producer = producer
        self.rng = rng or random.Random(0)
        self.calls: list[frozenset[str]] = []

    def truth(self, keep: Iterable[str]) -> bool:
        keep = frozenset(keep)
        return any(t <= keep for t in self.terms)

    def _producer(self, keep: frozenset[str]) -> str | None:
        missing = [c for c in self.candidates if c not in keep]
        if self.producer == "first":
            return next((c for c in missing if c in self.culprits), None)
        if self.producer == "random":
            return self.rng.choice(missing) if missing else None
        if self.producer == "liar":
            return next((c for c in missing if c not in self.culprits), None)
        return None

    def __call__(self, keep: frozenset[str]) -> bool | tuple[bool, str | None]:
        assert isinstance(keep, frozenset)
        assert keep <= frozenset(self.candidates)
        self.calls.append(keep)
        if self.truth(keep):
            return True
        return False, self._producer(keep)


def check(result: SearchResult, oracle: Oracle, hint=None) -> None:
    """Every property the search promises, verified by brute force."""
    n = len(oracle.candidates)
    # honest run count, no set evaluated twice, history matches the calls
    assert result.runs == len(oracle.calls) == len(result.history)
    assert len(set(oracle.calls)) == len(oracle.calls)
    assert [frozenset(k) for k, _ in result.history] == oracle.calls
    assert all(oracle.truth(k) == ok for k, ok in result.history)
    if not oracle.truth(oracle.candidates):
        assert result.keep is None and not result.solvable
        assert result.runs <= 2
        return
    assert result.solvable and result.keep is not None
    keep = result.keep
    # candidate order, no duplicates
    order = {c: i for i, c in enumerate(oracle.candidates)}
    assert list(keep) == sorted(set(keep), key=order.__getitem__)
    # passes and is 1-minimal
    assert oracle.truth(keep)
    for s in keep:
        assert not oracle.truth(set(keep) - {s}), f"{s} can be dropped from {keep}"
    # the final set was really evaluated (follows from monotonicity + 1-minimality)
    assert (keep, True) in result.history or (not keep and result.runs == 1)
    # the budget
    assert result.bound == run_bound(n, len(keep))
    assert result.runs <= run_bound(n, len(keep)), (result.runs, n, len(keep), hint)
    # no query was implied by earlier answers (monotone inference)
    for i, (k, _) in enumerate(result.history):
        ks = frozenset(k)
        for k0, ok0 in result.history[:i]:
            if ok0:
                assert not frozenset(k0) <= ks
            else:
                assert not ks <= frozenset(k0)


def search(n: int, terms, hint=None, producer: str = "none", seed: int = 0) -> tuple[SearchResult, Oracle]:
    cands = names(n)
    oracle = Oracle(cands, terms, producer=producer, rng=random.Random(seed))
    result = minimal_keep_set(cands, oracle, hint=hint)
    check(result, oracle, hint)
    return result, oracle


# ---------------------------------------------------------------- basic cases


def test_zero_culprits_costs_one_run():
    result, _ = search(50, [[]])
    assert result.keep == () and result.solvable and result.runs == 1


def test_no_solution_when_everything_fails():
    result, oracle = search(30, [])
    assert result.keep is None and not result.solvable and result.runs == 2
    assert oracle.calls == [frozenset(), frozenset(names(30))]


def test_no_candidates():
    assert minimal_keep_set([], lambda keep: True) == SearchResult((), 1, True, (((), True),), 2)
    result = minimal_keep_set([], lambda keep: False)
    assert result.keep is None and not result.solvable and result.runs == 1


def test_single_culprit_start_middle_end():
    for n in range(1, 201):
        for pos in sorted({0, n // 2, n - 1}):
            c = names(n)[pos]
            result, _ = search(n, [[c]])
            assert result.keep == (c,)
            # empty, all, bisection of n values, final check
            assert result.runs <= (3 + math.ceil(math.log2(n)) if n > 1 else 2)


def test_single_culprit_every_position_small_n():
    for n in range(1, 17):
        for c in names(n):
            result, _ = search(n, [[c]])
            assert result.keep == (c,)


def test_non_contiguous_and_blocks_1_and_4_of_6():
    blocks = [f"blocks.{i}" for i in range(6)]
    oracle = Oracle(blocks, [["blocks.1", "blocks.4"]])
    result = minimal_keep_set(blocks, oracle)
    check(result, oracle)
    assert result.keep == ("blocks.1", "blocks.4")


def test_and_of_many_spread_out():
    cands = names(128)
    culprits = [cands[i] for i in (3, 17, 18, 64, 127)]
    result, _ = search(128, [culprits])
    assert result.keep == tuple(culprits)


def test_or_semantics_either_suffices():
    result, _ = search(40, [["layers.7"], ["layers.30"]])
    # the prefix search keeps the earliest sufficient module
    assert result.keep == ("layers.7",)
    result, _ = search(40, [["layers.30"], ["layers.7"]], hint="layers.30")
    assert result.keep == ("layers.30",)


def test_mixed_and_or():
    # (a and b) or c or (d and e): every answer must be one of the terms
    terms = [["layers.2", "layers.9"], ["layers.20"], ["layers.5", "layers.25"]]
    for hint in (None, "layers.9", "layers.25", "layers.0"):
        for producer in ("none", "first", "random", "liar"):
            result, _ = search(32, terms, hint=hint, producer=producer)
            assert frozenset(result.keep) in {frozenset(t) for t in terms}


def test_all_candidates_needed():
    for n in (1, 2, 3, 7, 16):
        result, _ = search(n, [names(n)])
        assert result.keep == tuple(names(n))


# ---------------------------------------------------------------- hints and producers


@pytest.mark.parametrize("n", [2, 3, 10, 64, 200])
def test_correct_hint_costs_three_runs(n):
    for c in {names(n)[0], names(n)[n // 2], names(n)[-1]}:
        result, oracle = search(n, [[c]], hint=c)
        assert result.keep == (c,)
        assert result.runs == 3
        assert oracle.calls[2] == frozenset([c])


def test_wrong_hint_still_correct_and_bounded():
    for n in (2, 5, 33, 200):
        cands = names(n)
        for c in (cands[0], cands[-1]):
            wrong = cands[1] if c == cands[0] else cands[0]
            result, _ = search(n, [[c]], hint=wrong)
            assert result.keep == (c,)
            assert result.runs <= 4 + math.ceil(math.log2(n))


def test_unknown_and_duplicate_hints_are_ignored():
    result, _ = search(20, [["layers.4"]], hint=["nope", "layers.4", "layers.4"])
    assert result.keep == ("layers.4",) and result.runs == 3


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_producer_chain_costs_2k_plus_1(k):
    # NaN moves downstream each time its producer is kept: follow it run by run
    cands = names(128)
    culprits = [cands[i] for i in (5, 40, 41, 90)[:k]]
    result, oracle = search(128, [culprits], producer="first")
    assert result.keep == tuple(culprits)
    assert result.runs == 2 * k + 1
    assert oracle.calls[2] == frozenset(culprits[:1])


def test_producer_chain_longer_than_the_ledger_allows():
    cands = names(64)
    culprits = cands[::6]  # 11 culprits
    result, _ = search(64, [culprits], producer="first")
    assert result.keep == tuple(culprits)
    assert result.runs < 2 + len(culprits) * (1 + 6)  # much cheaper than plain bisection


def test_adversarial_producers_and_hints_stay_within_bound():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 60)
        cands = names(n)
        k = rng.randint(1, min(n, 5))
        culprits = rng.sample(cands, k)
        non = [c for c in cands if c not in culprits]
        hint = rng.sample(non, min(len(non), rng.randint(0, 3)))
        search(n, [culprits], hint=hint, producer="liar")


# ---------------------------------------------------------------- randomized budget


def random_terms(rng: random.Random, cands: list[str]) -> list[list[str]]:
    n = len(cands)
    kind = rng.random()
    if kind < 0.05:
        return [[]]
    if kind < 0.1:
        return []
    if kind < 0.6:  # AND of k
        return [rng.sample(cands, rng.randint(1, min(n, 6)))]
    return [rng.sample(cands, rng.randint(1, min(n, 3))) for _ in range(rng.randint(1, 4))]


def test_randomized_minimality_and_budget():
    rng = random.Random(1234)
    worst = 0.0
    for trial in range(600):
        n = rng.randint(1, 200)
        cands = names(n)
        terms = random_terms(rng, cands)
        culprits = sorted({c for t in terms for c in t})
        hint_kind = rng.choice(["none", "right", "wrong", "many"])
        hint = {
            "none": None,
            "right": culprits[:1] or None,
            "wrong": rng.sample(cands, 1),
            "many": rng.sample(cands, min(n, 4)),
        }[hint_kind]
        producer = rng.choice(["none", "first", "random", "liar"])
        result, _ = search(n, terms, hint=hint, producer=producer, seed=trial)
        if result.keep and n > 1:
            worst = max(worst, (result.runs - 2) / (2 * len(result.keep) * math.log2(n)))
    assert worst <= 1.0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    data=st.data(),
    producer=st.sampled_from(["none", "first", "random", "liar"]),
)
def test_property_any_monotone_dnf(n, data, producer):
    cands = names(n)
    idx = st.integers(0, n - 1)
    terms = data.draw(st.lists(st.lists(idx, min_size=0, max_size=5), min_size=0, max_size=4), label="terms")
    hint = data.draw(st.lists(idx, max_size=3), label="hint")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    search(
        n, [[cands[i] for i in t] for t in terms], hint=[cands[i] for i in hint], producer=producer, seed=seed
    )


# ---------------------------------------------------------------- state machine API


def test_state_machine_and_driver_agree():
    rng = random.Random(99)
    for trial in range(100):
        n = rng.randint(1, 80)
        cands = names(n)
        terms = random_terms(rng, cands)
        hint = rng.sample(cands, 1) if rng.random() < 0.5 else None
        producer = rng.choice(["none", "first", "random"])
        by_driver = minimal_keep_set(cands, Oracle(cands, terms, producer, random.Random(trial)), hint)

        oracle = Oracle(cands, terms, producer, random.Random(trial))
        sm = PrecisionSearch(cands, hint=hint)
        assert sm.bound() == 2
        done = False
        while (keep := sm.next_query()) is not None:
            assert not done
            assert sm.next_query() == keep  # idempotent until report
            out = oracle(keep)
            passed, prod = out if isinstance(out, tuple) else (out, None)
            done = sm.report(passed, prod)
            assert done == sm.done
        assert done and sm.done
        assert sm.result == by_driver.keep
        assert sm.solvable == by_driver.solvable
        assert sm.runs == by_driver.runs
        assert sm.history == by_driver.history
        assert sm.bound() == by_driver.bound
        if sm.result is not None:
            assert sorted(sm.found) == sorted(sm.result)


def test_state_machine_guards():
    with pytest.raises(ValueError, match="duplicate"):
        PrecisionSearch(["a", "b", "a"])
    sm = PrecisionSearch(["a", "b", "c"], hint="b")
    assert sm.candidates == ("a", "b", "c")
    assert sm.next_query() == frozenset()
    with pytest.raises(RuntimeError, match="not finished"):
        _ = sm.result
    assert sm.report(False, producer="not-a-module") is False
    assert sm.next_query() == frozenset("abc")
    assert sm.report(True, producer="ignored-after-pass") is False
    assert sm.next_query() == frozenset("b")  # the hint is tried first
    assert sm.report(True) is True
    assert sm.next_query() is None
    assert sm.result == ("b",) and sm.solvable and sm.runs == 3 and sm.bound() == 5
    with pytest.raises(RuntimeError, match="finished"):
        sm.report(True)


def test_producer_overrides_older_hint():
    sm = PrecisionSearch(names(10), hint="layers.1")
    sm.report(False, producer="layers.6")  # the empty run
    sm.report(True)  # the full run
    assert sm.next_query() == frozenset(["layers.6"])


def test_run_bound():
    assert run_bound(0, 0) == run_bound(1, 1) == 2
    assert run_bound(2, 1) == 4
    assert run_bound(1024, 3) == 62
    assert run_bound(100, 0) == 2
    with pytest.raises(ValueError):
        run_bound(-1, 0)
