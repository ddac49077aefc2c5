"""The quantized formats nanhunter knows, in the order they claim tensors (most specific first).

Adding a format is one module with one ``QuantFormat`` class and one line in ``FORMATS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import BadInput
from .. import bounded_json
from ..regular_file import read_regular
from .awq import Awq
from .base import Context, QuantFormat, QuantizedScan, QuantizedWeight
from .bnb import Bnb4bit, Bnb8bit
from .fp8 import Fp8
from .gguf import Gguf
from .gptq import Gptq
from .grade import check
from .int_group import IntGroup
from .mxfp4 import Mxfp4
from .nvfp4 import Nvfp4
from .orphans import ScalesNotFound
from .scales import StandaloneScales

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint

#: every registered format, in claiming order
FORMATS: list[QuantFormat] = [
    Gguf(),
    Bnb4bit(),
    Bnb8bit(),
    Gptq(),
    Awq(),
    Mxfp4(),
    Nvfp4(),
    IntGroup(),
    Fp8(),
    StandaloneScales(),
    ScalesNotFound(),  # last: integer/fp8/fp4 layer weights no format claimed
]


def register(fmt: QuantFormat, before: str | None = None) -> None:
    """Add a format (before the one named ``before``, else before the final catch-all)."""
    names = [f.name for f in FORMATS]
    FORMATS.insert(names.index(before) if before in names else len(FORMATS) - 1, fmt)


def quantization_config(ck: Checkpoint) -> dict[str, Any]:
    """``config.json``'s ``quantization_config`` (``{}`` when there is none)."""

    if ck.config_path is None:
        return {}
    try:
        data = bounded_json.loads(
            read_regular(ck.config_path, "config", 16 << 20), str(ck.config_path), constants=True
        )
    except Exception:  # noqa: BLE001 - a broken config.json is reported where the model is built
        return {}
    q = data.get("quantization_config") if isinstance(data, dict) else None
    return q if isinstance(q, dict) else {}


def find_quantized(ck: Checkpoint) -> tuple[list[QuantizedWeight], list[dict[str, str]], set[str]]:
    """Quantized weights of ``ck``, the ones found that cannot be checked (``{name, dtype, reason}``),
    and every tensor name a format claimed (data, scales, zero points, quant states)."""
    ctx = Context(ck, quantization_config(ck), set(ck.names()))
    found: list[QuantizedWeight] = []
    for fmt in FORMATS:
        found += fmt.detect(ctx)
    return found, ctx.unchecked, ctx.claimed


def scan_quantized(ck: Checkpoint) -> tuple[list[QuantizedScan], list[dict[str, str]]]:
    """Every quantized weight of ``ck`` checked; and those that could not be (for ``weights.unchecked``)."""
    out, unchecked, _ = scan_quantized_claims(ck)
    return out, unchecked


def scan_quantized_claims(ck: Checkpoint) -> tuple[list[QuantizedScan], list[dict[str, str]], set[str]]:

    found, unchecked, claimed = find_quantized(ck)
    out = []
    for q in found:
        try:
            with np.errstate(all="ignore"):  # IEEE results (inf, NaN) are what is judged: no warnings
                r = check(ck, q)
        except BadInput:
            raise
        except (
            RuntimeError,
            ValueError,
            TypeError,
            ZeroDivisionError,
            IndexError,
            OverflowError,
            KeyError,
        ) as e:
            # shapes that name a known layout but do not fit it (a hostile or broken file): not checked,
            # and said so, rather than an internal error (numpy raises ValueError, IndexError or TypeError
            # where torch raised RuntimeError)
            unchecked.append(
                {
                    "name": q.name,
                    "dtype": q.format,
                    "reason": f"does not fit the {q.format} layout ({type(e).__name__}: {str(e)[:120]})",
                }
            )
            continue
        if r.skipped:
            unchecked.append({"name": q.name, "dtype": q.format, "reason": r.skipped})
        else:
            out.append(r)
    return out, unchecked, claimed
