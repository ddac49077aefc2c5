"""The precision an entry was computed in, and the ops that cannot make a difference.

- ``is_exact(entry)``: an op whose output is its operands' values, bit for bit (a cast to a wider
  dtype, a copy, a concatenation, indexing). Views and reshapes have no entry at all (the trace
  passes their operand's producer on). An exact op carries a difference in; it is never where
  two runs part.
- ``carried_dtypes(entries)``: per entry, the dtypes whose rounding its value carries — its own
  output dtype, the dtypes of its floating inputs and, through the producers, every dtype the
  value was computed in before (an fp32 ``pow`` of a bf16 value upcast exactly carries bf16's
  rounding, and is judged at bf16's tolerance).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: aten ops (the name between ``aten.`` and the overload) whose output holds operand values exactly
EXACT_OPS = frozenset(
    (
        "cat",
        "concat",
        "concatenate",
        "stack",
        "hstack",
        "vstack",
        "copy",
        "copy_",
        "_copy_from",
        "index",
        "_unsafe_index",
        "index_select",
        "gather",
        "embedding",
        "take",
        "take_along_dim",
        "repeat",
        "tile",
        "slice_scatter",
        "select_scatter",
        "as_strided_scatter",
        "roll",
        "flip",
        "expand_copy",
        "permute_copy",
        "view_copy",
        "_unsafe_view",
        "view",
        "reshape",
        "clone",
        "alias",
        "t_copy",
        "transpose_copy",
    )
)
#: ops that convert dtype: exact only when the output dtype holds every value of the input's
CASTS = frozenset(("_to_copy", "to", "copy", "copy_", "_copy_from", "type_as"))
_FP8 = ("fp8-e4m3", "fp8-e5m2", "fp8-e4m3fnuz", "fp8-e5m2fnuz")
#: dtype → the dtypes it holds exactly (every finite value of them is one of its values)
HOLDS: dict[str, frozenset[str]] = {
    "fp64": frozenset(("fp32", "bf16", "fp16", *_FP8)),
    "fp32": frozenset(("bf16", "fp16", *_FP8)),
    "bf16": frozenset(("fp8-e4m3", "fp8-e4m3fnuz")),
    "fp16": frozenset(("fp8-e4m3", "fp8-e5m2", "fp8-e4m3fnuz", "fp8-e5m2fnuz")),
}


def op_name(op: str | None) -> str | None:
    """``aten._to_copy.default`` → ``_to_copy`` (None for a module entry)."""
    if not op:
        return None
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] in ("aten", "prims") else parts[0]


def widens(src: str | None, dst: str | None) -> bool:
    """Whether a value of dtype ``src`` is held exactly by ``dst`` (the same dtype included)."""
    return src is not None and dst is not None and (src == dst or src in HOLDS.get(dst, frozenset()))


def is_exact(e: Any, input_dtypes: Sequence[str | None] | None = None) -> bool:
    """Whether op entry ``e`` only moved or widened its operands' values (module docstring).
    ``input_dtypes``: the floating inputs' dtypes (default: ``e.input_dtypes``); a cast whose
    inputs' dtypes are unknown is not taken as exact."""
    name = op_name(getattr(e, "op", None))
    if name is None:
        return False
    dtypes = list(input_dtypes if input_dtypes is not None else (getattr(e, "input_dtypes", None) or ()))
    if name in CASTS:
        return bool(dtypes) and all(widens(d, e.dtype) for d in dtypes)
    if name in EXACT_OPS:
        # indexing and concatenation keep the dtype; one that changes it rounds
        return all(d == e.dtype for d in dtypes)
    return False


def carried_dtypes(entries: Sequence[Any]) -> list[frozenset[str]]:
    """Per entry (in order), the dtypes whose rounding its value carries (module docstring).
    Producers are earlier entries, so one pass suffices."""
    out: list[frozenset[str]] = []
    for e in entries:
        own = {d for d in (e.dtype, *(getattr(e, "input_dtypes", None) or ())) if d}
        for p in getattr(e, "producers", None) or ():
            if p is not None and 0 <= p < len(out):
                own |= out[p]
        out.append(frozenset(own))
    return out
