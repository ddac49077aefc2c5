"""Numerics or hardware: ``first_nonfinite.reproducible`` decides the ``not_reproducible`` cause.

The report's own re-run decides (``session.Watch._locate`` for forwards, ``training.locate`` for
backward passes, the optimizer re-run from the pre-step copy): the failing region re-run from its
captured inputs and the weights of the failing step, on the same device, dtype and autocast. When
it was finite (``reproducible is False``) the diagnosis becomes ``not_reproducible``, naming the
device and, under torch.distributed, this rank; what the captured values alone suggested stays as
evidence. ``None`` (no re-run possible) leaves the diagnosis as it is.
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
