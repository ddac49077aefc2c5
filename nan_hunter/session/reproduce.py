"""Numerics or hardware: ``first_nonfinite.reproducible`` decides the ``not_reproducible`` cause.

The report's own re-run decides (``session.Watch._locate`` for forwards, ``training.locate`` for
backward passes, the optimizer re-run from the pre-step copy): the failing region re-run from its
captured inputs and the weights of the failing step, on the same device, dtype and autocast. When
it was finite (``reproducible is False``) the diagnosis becomes ``not_reproducible``, naming the
device and, under torch.distributed, this rank; what the captured values alone suggested stays as
evidence. ``None`` (no re-run possible) leaves the diagnosis as it is.

Whether a forward's re-run faulted again is the one comparison of two recordings
(``divergence.compare``, as ``nanhunter diff`` and ``scan --compile`` use it): the re-run's
module calls against the failing forward's, paired by call; it faulted again when the call that
first went non-finite is non-finite again, in the same classes (``faulted_again``).
"""

from __future__ import annotations

from typing import Any

from ..distributed import collectives as dist
from ..explain.diagnose import not_reproducible


def reproducible_verdict(rep: Any, device: Any) -> None:
    fnf = rep.first_nonfinite
    if fnf is None or fnf.reproducible is not False:
        return
    rank = dist.rank() if dist.active() else None
    dtype = rep.diagnosis.dtype if rep.diagnosis is not None else (rep.run or {}).get("dtype")
    rep.diagnosis = not_reproducible(fnf.module, fnf.op, dtype, fnf.kind, str(device), rank, rep.diagnosis)


def faulted_again(original_calls: list[Any], original_rows: Any, rerun_calls: list[Any], rerun_rows: Any) -> bool:
    """Whether the re-run's recording holds the failing forward's first non-finite value again
    (module docstring); True when the failing forward's recording has no call to pair it with."""
    from ..divergence.compare import compare_recordings
    from ..divergence.recordings import from_calls

    cmp = compare_recordings(from_calls(rerun_calls, rerun_rows), from_calls(original_calls, original_rows))
    again = cmp.same_first_fault
    return True if again is None else again

