"""Modes: what a run does with the model, behind one protocol (``harness``).

A mode says what it runs (one forward per input, a ``generate()`` loop, forward and backward of a
loss, a capsule's step), what capture records while it runs, and how its failing step is re-run
for op location, replay and fixes. ``harness`` runs any of them the same way; ``compiled``
compares a run with its ``torch.compile`` form after it.
"""
