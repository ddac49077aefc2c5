"""The search strategy behind ``nanhunter bisect`` and ``scan``'s keep-in-higher-precision fix
(``explain.keep_fix``): a 1-minimal set of modules to keep in fp32.

Pure Python; knows nothing about torch or models. A runner drives it with results of real runs.

Problem
-------
``candidates`` are N module names in execution order. An unknown *monotone* predicate
``passes(keep)`` says whether the model, run in low precision except for the modules in ``keep``
(kept in high precision), is finite/accurate; monotone means a superset of a passing set passes.
We want ``S`` with ``passes(S)`` and ``not passes(S - {s})`` for every ``s`` in ``S`` (1-minimal).
``passes(all)`` false means there is no solution; ``passes(empty)`` true gives ``S = ()``.

Unlike Polygraphy's precision bisection, which only finds a prefix or a suffix of layers to keep,
this finds a non-contiguous set, and it handles AND interactions (several modules all needed) and
OR interactions (any one of several modules suffices: it returns one of the 1-minimal choices).

Algorithm: find the next culprit by a prefix search
---------------------------------------------------
State: ``found`` (certified culprits) and ``rest`` (an ordered list of the other live
candidates), with the invariant that ``passes(found | rest)`` is known to be true. A *phase*
looks for the smallest ``j`` in ``[0, len(rest)]`` such that ``passes(found | rest[:j])``
(it exists because ``j = len(rest)`` passes, and it is unique because the predicate is monotone
along the prefix chain). It keeps an interval ``[lo, hi]`` that contains ``j``: ``prefix(hi)``
passes, ``prefix(lo - 1)`` fails (when ``lo >= 1``).

* ``j == 0``: ``found`` itself passes, the search ends with ``found``.
* ``j >= 1``: ``c = rest[j - 1]`` is *certified*: ``found + [c]``, and ``rest`` is cut to
  ``rest[:j - 1]``. The invariant holds because ``found | rest[:j]`` passes.

Why the answer is 1-minimal: when ``c`` is certified, ``Z_c = found | rest[:j - 1]`` is known to
fail; everything certified later comes from ``rest[:j - 1]`` (``rest`` only shrinks or is
reordered), so ``final - {c}`` is a subset of ``Z_c`` and fails by monotonicity. No separate
minimization pass is needed, and none of the runs is spent on one.

The order of ``rest`` is free: the invariant only involves it as a set, so the search may move an
element inside it as long as the known prefixes keep their meaning (see *hints*). By default it
is the execution order, phases probe ``j = 0`` first (does ``found`` already pass? that usually
ends the search after the last culprit) and then bisect ``[lo, hi]`` at the midpoint.

Hints
-----
The caller may name likely culprits up front (``hint``, e.g. the first NaN producer found by a
capture run), and after a failing run it may report the *producer*: the first module whose
output turned non-finite in that run. Both go on a hint queue (the most recent producer first,
then the caller's hints; each name is tried at most once). They are used in two ways:

* **scan** (sufficiency, 1 run): with ``prefix(lo - 1)`` known to fail, move hint ``h`` to index
  ``lo - 1`` of ``rest`` and probe ``j = lo``, i.e. ``found | rest[:lo - 1] | {h}``. If it
  passes, ``h`` is certified at once; if it fails, ``lo`` grows by one and ``h`` stays kept in
  every later probe of the phase, and the producer of *that* run is scanned next. A chain of
  NaNs that moves downstream each time a producer is kept (``p1``, then ``p2``, ...) is thus
  followed run by run instead of bisected.
* **belief probe** (necessity, 1 run): a phase whose ``rest`` ends with a scanned hint (left over
  from a scan that needed several hints) first probes ``j = len(rest) - 1``, i.e. everything but
  that hint. If it fails the hint is certified in one run.

For a chain of k producers this costs ``2k + 1`` runs in all (see the tests), against about
``k * (log2 N + 1) + 2`` for plain bisection, as long as k stays within about ``log2 N`` (beyond
that the ledger below makes the rest of the chain bisect).

Speculation is bounded twice: the ledger below guarantees the worst case, and a trust counter
keeps misleading producers from eating the whole slack on average: it starts at
``max(2, ceil(log2 N))``, each scan spends one unit, and each scanned hint that ends up certified
earns two back.

Memoization and monotone inference
----------------------------------
No set is evaluated twice, and a probe whose outcome follows from earlier ones by monotonicity
(a superset of a passing set, a subset of a failing set) is not run either.

Budget and its proof
--------------------
For k culprits among N candidates (N >= 2) the search makes at most ``2 + 2k·log2(N)`` runs
(``run_bound``), whatever the hints and producers say; for N <= 1 at most 2.

Without hints: the empty run (phase 1's ``j = 0`` check), the full run (skipped when the empty
run passes), then per certified culprit at most ``ceil(log2 N)`` bisection runs (at most N
values) plus the next phase's ``j = 0`` check: ``2 + k·(1 + ceil(log2 N))`` in all; this is
``<= 2 + 2k·log2 N`` because ``ceil(log2 N) + 1 <= 2·log2 N`` for every N >= 2 (check N = 2, 3;
above that ``ceil(x) < x + 1 <= 2x - 1`` for ``x = log2 N >= 2``).

Hint probes are extra runs, so they are paid from a ledger: the budget is
``B(k) = 2 + 2k·log2 N`` with k the culprits certified so far, and a phase that knows
``prefix(lo - 1)`` fails will certify one more, i.e. may spend up to ``B(k + 1)``. The
invariant is "the default strategy (probe ``j = 0``, then bisect) can finish the current phase,
and keep one run in reserve for the next phase's ``j = 0`` check, within the budget". It holds
at the first phase (that is the computation above), the default strategy preserves it (each
bisection probe halves the interval, so its worst case drops by one run), and it holds at the
start of every phase since ``ceil(log2 h) + 1 <= 2·log2 N`` for ``1 < h < N``. A hint probe or
belief probe is made only when the invariant still holds after either of its outcomes
(``_affordable``), so by induction the final count never exceeds ``B(k)``. Good hints save runs,
and the savings pay for later speculation; wrong hints cost at most the slack.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass

__all__ = [
    "PrecisionSearch",
    "SearchResult",
    "minimal_keep_set",
    "run_bound",
]

#: One evaluated keep set, as (names in candidate order, passed).
HistoryEntry = tuple[tuple[str, ...], bool]
#: What a ``passes`` callback returns: the verdict, or the verdict and the producer of a failure.
PassesResult = bool | tuple[bool, str | None]

_EPS = 1e-9


def run_bound(n: int, k: int) -> int:
    """The most runs the search makes for ``k`` culprits among ``n`` candidates.

    ``floor(2 + 2·k·log2 n)``, and 2 when ``n <= 1`` (the empty and the full run).
    """
    if n < 0 or k < 0:
        raise ValueError(f"run_bound needs n >= 0 and k >= 0, got n={n}, k={k}")
    if n <= 1:
        return 2
    return math.floor(2 + 2 * k * math.log2(n) + _EPS)


def _ceil_log2(m: int) -> int:
    """Probes a bisection needs to pick one of ``m`` values (0 for ``m <= 1``)."""
    return (m - 1).bit_length() if m > 1 else 0


def _as_names(hint: str | Iterable[str] | None) -> list[str]:
    if hint is None:
        return []
    if isinstance(hint, str):
        return [hint]
    return [str(h) for h in hint]


class PrecisionSearch:
    """State machine finding a 1-minimal keep set; see the module docstring for the algorithm.

    Drive it like this::

        search = PrecisionSearch(names, hint=first_producer)
        while (keep := search.next_query()) is not None:
            ok, producer = run_with_modules_kept(keep)  # producer: first NaN module or None
            search.report(ok, producer)
        search.result  # names in candidate order, or None when even keeping all fails

    Args:
        candidates: distinct module names, in execution order.
        hint: a name or names likely to be culprits; names that are not candidates are ignored.
    """

    def __init__(self, candidates: Iterable[str], hint: str | Iterable[str] | None = None) -> None:
        self._candidates: tuple[str, ...] = tuple(candidates)
        self._index: dict[str, int] = {name: i for i, name in enumerate(self._candidates)}
        if len(self._index) != len(self._candidates):
            dups = sorted(name for name, n in Counter(self._candidates).items() if n > 1)
            raise ValueError(f"duplicate candidate names: {dups[:5]}")
        self._n = len(self._candidates)
        # Hint queue, best first: the latest producers, then the caller's hints.
        self._hints: list[str] = [h for h in dict.fromkeys(_as_names(hint)) if h in self._index]
        self._scanned: set[str] = set()  # hints a scan moved into place (each is scanned once)
        # Average-case guard on speculation (the ledger guards the worst case): every scan
        # spends one unit, every scanned hint that gets certified earns two.
        self._trust = max(2, _ceil_log2(self._n))
        self._memo: dict[frozenset[str], bool] = {}
        self._passing: list[frozenset[str]] = []
        self._failing: list[frozenset[str]] = []
        self._history: list[HistoryEntry] = []
        self._found: list[str] = []
        self._result: tuple[str, ...] | None = None
        self._done = False
        self._gen = self._search()
        self._pending: frozenset[str] | None = self._advance(None)

    # ----------------------------------------------------------------- public API

    @property
    def candidates(self) -> tuple[str, ...]:
        return self._candidates

    @property
    def done(self) -> bool:
        return self._done

    @property
    def runs(self) -> int:
        """Evaluations reported so far (every one a distinct keep set)."""
        return len(self._history)

    @property
    def history(self) -> tuple[HistoryEntry, ...]:
        """Every evaluated keep set (names in candidate order) and its verdict, in query order."""
        return tuple(self._history)

    @property
    def found(self) -> tuple[str, ...]:
        """Culprits certified so far, in the order they were certified (for progress output)."""
        return tuple(self._found)

    @property
    def result(self) -> tuple[str, ...] | None:
        """The 1-minimal keep set in candidate order, or None when there is no solution."""
        if not self._done:
            raise RuntimeError("the search is not finished; keep answering next_query()")
        return self._result

    @property
    def solvable(self) -> bool:
        """False when keeping every candidate in high precision still fails."""
        return self.result is not None

    def bound(self) -> int:
        """``run_bound(N, k)`` for the culprits found so far (the final guarantee once done)."""
        k = len(self._result) if self._done and self._result is not None else len(self._found)
        return run_bound(self._n, k)

    def next_query(self) -> frozenset[str] | None:
        """The keep set to evaluate next, or None when the search is finished.

        Asking again before ``report`` returns the same set.
        """
        return self._pending

    def report(self, passed: bool, producer: str | None = None) -> bool:
        """Give the verdict for ``next_query()``; returns True when the search is finished.

        Args:
            passed: whether the run with ``next_query()`` kept in high precision passed.
            producer: after a failing run, the first module whose output turned non-finite, if
                known. It becomes the strongest hint. Ignored after a passing run and when it
                is not a candidate.
        """
        keep = self._pending
        if keep is None:
            raise RuntimeError("the search is finished; there is nothing to report")
        passed = bool(passed)
        self._memo[keep] = passed
        (self._passing if passed else self._failing).append(keep)
        self._history.append((self._ordered(keep), passed))
        if not passed and producer is not None and producer in self._index:
            self._push_hint(producer)
        self._pending = self._advance(passed)
        return self._done

    # ----------------------------------------------------------------- internals

    def _ordered(self, names: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(names, key=self._index.__getitem__))

    def _advance(self, passed: bool | None) -> frozenset[str] | None:
        try:
            return next(self._gen) if passed is None else self._gen.send(passed)
        except StopIteration:
            self._done = True
            return None

    def _push_hint(self, name: str) -> None:
        if name in self._scanned or name in self._found:
            return
        if name in self._hints:
            self._hints.remove(name)
        self._hints.insert(0, name)

    def _infer(self, keep: frozenset[str]) -> bool | None:
        """The verdict for ``keep`` if it is known or follows by monotonicity, else None."""
        known = self._memo.get(keep)
        if known is not None:
            return known
        if any(p <= keep for p in self._passing):
            return True
        if any(keep <= f for f in self._failing):
            return False
        return None

    def _eval(self, keep: frozenset[str]) -> Generator[frozenset[str], bool, bool]:
        known = self._infer(keep)
        if known is not None:
            return known
        passed = yield keep
        return passed

    def _budget(self, k: int) -> int:
        return run_bound(self._n, k)

    def _default_ok(self, runs: int, lo: int, hi: int, k: int) -> bool:
        """Can the default strategy finish the phase from here within budget, with reserve?

        ``runs`` evaluations made, ``j`` in ``[lo, hi]``, ``k`` culprits certified before this
        phase. Finishing with ``j >= 2`` leaves a non-empty ``rest``, so one run is kept back for
        the next phase's ``j = 0`` check.
        """
        if lo >= hi:
            if lo == 0:
                return runs <= self._budget(k)
            return runs + (1 if lo >= 2 else 0) <= self._budget(k + 1)
        reserve = 1 if hi >= 2 else 0
        if lo == 0:  # probe j = 0: it may end the search, or it fails and we bisect [1, hi]
            return runs + 1 <= self._budget(k) and (
                runs + 1 + _ceil_log2(hi) + reserve <= self._budget(k + 1)
            )
        return runs + _ceil_log2(hi - lo + 1) + reserve <= self._budget(k + 1)

    def _affordable(self, keep: frozenset[str], lo: int, hi: int, p: int, k: int) -> bool:
        """May we probe prefix ``p`` (set ``keep``) instead of following the default strategy?"""
        if self._infer(keep) is not None:
            return True  # free
        runs = self.runs + 1
        return self._default_ok(runs, lo, p, k) and self._default_ok(runs, p + 1, hi, k)

    def _pick_hint(self, rest: list[str], lo: int, hi: int) -> str | None:
        """The best untried hint that may be moved to index ``lo - 1`` of ``rest``.

        Only a hint at index ``lo - 1 .. hi - 1`` can be moved without changing the meaning of
        the known prefixes. Hints no longer in ``rest``, or beyond ``hi`` (which the phase is
        going to drop), are discarded; hints inside the known-failing prefix wait.
        """
        for h in list(self._hints):
            if h in self._scanned:
                self._hints.remove(h)
                continue
            try:
                i = rest.index(h)
            except ValueError:
                self._hints.remove(h)
                continue
            if i >= hi:
                self._hints.remove(h)
                continue
            if i >= lo - 1:
                return h
        return None

    def _search(self) -> Generator[frozenset[str], bool, None]:
        if (yield from self._eval(frozenset())):
            self._result = ()
            return
        if not (yield from self._eval(frozenset(self._candidates))):
            self._result = None
            return
        found = self._found
        rest = list(self._candidates)
        lo = 1  # the empty prefix is known to fail

        def keep_of(p: int) -> frozenset[str]:
            return frozenset(found) | frozenset(rest[:p])

        while rest:
            hi = len(rest)
            k = len(found)
            # Belief probe: rest ends with a scanned hint, probably needed: drop just that one.
            if lo == 0 and hi >= 2 and rest[-1] in self._scanned:
                p = hi - 1
                if self._affordable(keep_of(p), lo, hi, p, k):
                    if (yield from self._eval(keep_of(p))):
                        hi = p
                    else:
                        lo = p + 1
            while lo < hi:
                p = (lo + hi) // 2 if lo > 0 else 0
                if lo > 0 and self._trust > 0:
                    h = self._pick_hint(rest, lo, hi)
                    if h is not None:
                        candidate = keep_of(lo - 1) | {h}
                        if self._affordable(candidate, lo, hi, lo, k):
                            rest.remove(h)
                            rest.insert(lo - 1, h)
                            self._scanned.add(h)
                            self._trust -= 1
                            p = lo
                if (yield from self._eval(keep_of(p))):
                    hi = p
                else:
                    lo = p + 1
            if lo == 0:
                break  # found passes on its own
            found.append(rest[lo - 1])
            if rest[lo - 1] in self._scanned:
                self._trust += 2
            del rest[lo - 1 :]
            lo = 0
        self._result = self._ordered(found)


@dataclass(frozen=True)
class SearchResult:
    """Outcome of ``minimal_keep_set``.

    Attributes:
        keep: the 1-minimal keep set in candidate order; None when there is no solution.
        runs: predicate evaluations made (each a distinct keep set).
        solvable: False when keeping every candidate still fails.
        history: every evaluated keep set (candidate order) and its verdict, in query order.
        bound: ``run_bound(N, len(keep))``, the guaranteed maximum of ``runs``.
    """

    keep: tuple[str, ...] | None
    runs: int
    solvable: bool
    history: tuple[HistoryEntry, ...]
    bound: int = 2


def minimal_keep_set(
    candidates: Iterable[str],
    passes: Callable[[frozenset[str]], PassesResult],
    hint: str | Iterable[str] | None = None,
) -> SearchResult:
    """Run ``PrecisionSearch`` to the end with ``passes`` as the predicate.

    ``passes(keep)`` returns whether the run with ``keep`` in high precision passes, or a tuple
    ``(passed, producer)`` where ``producer`` names the first module that produced a NaN/Inf in
    a failing run (or None). It is never called twice with the same set.
    """
    search = PrecisionSearch(candidates, hint=hint)
    while (keep := search.next_query()) is not None:
        out = passes(keep)
        if isinstance(out, tuple):
            passed, producer = out
        else:
            passed, producer = out, None
        search.report(bool(passed), producer)
    return SearchResult(
        keep=search.result,
        runs=search.runs,
        solvable=search.solvable,
        history=search.history,
        bound=search.bound(),
    )
