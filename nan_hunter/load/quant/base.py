"""What every quantized format provides (``QuantFormat``), and what the check gives back.

A format is one class in its own module, registered once in ``registry.FORMATS``. It answers three
questions, and the checking, the reading and the reporting live once, in ``grade``:

- ``detect(ctx)``: which tensors of the checkpoint it owns (from ``config.json``'s
  ``quantization_config`` and the tensor names), as ``QuantizedWeight`` s; tensors it recognises but
  cannot check go to ``ctx.unchecked`` with the reason. It claims every tensor it consumes
  (``ctx.claim``), so the formats after it never see them.
- ``blocks(ck, q)``: the weight's scales as stored (one value per block, group, absmax block, SCB
  row or GGUF block, flattened in storage order), the index shape ``bad_blocks`` uses, the largest
  ``|code - zero point|`` a block can hold (``bound``) and how blocks map to *stripes*: the unit in
  which the data is read.
- ``window(ck, q, first, count)``: dequantize a window of ``count`` stripes from ``first``: for every
  block in it, the largest ``|code - zero point|`` (the block's dequantized absmax divided by its
  scale; 0 means the block holds no data).

``grade`` reads only the stripes it needs (blocks whose scale is zero, and the blocks whose scale
could make them the absmax), or every stripe in bounded windows when that is fewer reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..bit_dtypes import float32_table
from ..float_bits import FLOATS

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint

MAX_BAD_BLOCKS = 1000  # listed per tensor; n_bad counts them all
FP16_MAX, BF16_MAX = 65504.0, 3.3895313892515355e38
FP8_TAGS = frozenset({"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})
FLOAT_TAGS = frozenset({"F64", "F32", "F16", "BF16"})
#: tags a scale can be read from (E8M0 and uint8 exponents are decoded by the format)
SCALE_TAGS = FLOAT_TAGS | FP8_TAGS | {"F8_E8M0", "U8"}
INT_TAGS = frozenset({"I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64"})


@dataclass
class QuantizedWeight:
    """One quantized weight as found: its data tensor, its scale tensor, and the format that reads it.
    ``layout`` is the format's own description (a small dataclass of its module)."""

    name: str  # the tensor holding the quantized codes
    format: str  # the report's format string: fp8_block, gptq, gguf:Q4_K, scale, ...
    scale: str  # the tensor holding the scales
    handler: QuantFormat
    layout: Any = None
    cache: dict[str, Any] = field(default_factory=dict, repr=False)  # what blocks() read, for window()


@dataclass
class Blocks:
    """The scales of one quantized weight, as ``grade`` judges them."""

    values: np.ndarray  # float32 [n_blocks]: each block's scale, in the scale tensor's storage order
    shape: list[int]  # the index shape of ``bad_blocks`` (the scale tensor's shape as stored)
    bound: float | np.ndarray  # largest |code - zero| a block can hold (a number, or float32 [n_blocks])
    stripe_of: np.ndarray | None  # int64 [n_blocks]: the stripe holding each block (None: no data to read)
    n_stripes: int
    stripe_bytes: int  # bytes read per stripe (windows of the full pass hold about PIECE bytes)
    multiplier: float = 1.0  # a global scale applied to every block (nvfp4)
    #: problems that are faults; "negative" is listed but not a fault where a sign is a format's convention
    negative_is_fault: bool = False
    negative_listed: bool = True
    zero_is_fault: bool = False  # a zero scale is bad whatever the block holds (activation/KV scales)
    #: bad blocks the format found itself (a NaN global scale, a zero point of the wrong convention)
    extra_bad: list[dict[str, Any]] = field(default_factory=list)
    extra_faults: int = 0
    #: blocks whose exact magnitude is known without reading data (float32 [n_blocks], -1 = unknown)
    known: np.ndarray | None = None
    #: the dequantized absmax is an upper bound only (formats whose codes are not decoded): None in the
    #: report, and fp16/bf16 overflow is said only where the bound rules it out
    bound_only: bool = False
    #: ``window`` gives each block's largest |dequantized value| itself (not divided by its scale) and
    #: ``bound`` is an upper bound of it (GGUF: a block's values depend on d and dmin)
    absolute: bool = False
    #: blocks excluded from the absmax besides those with a non-finite scale (a NaN dmin)
    exclude: np.ndarray | None = None
    #: values each block dequantizes to (an int for all, or int64 [n_blocks]: a partial last block holds
    #: fewer); None when the format cannot say (then ``dequant_nonfinite`` is null where it is not 0)
    sizes: int | np.ndarray | None = None


@dataclass
class QuantizedScan:
    name: str
    format: str
    scale: str
    n_blocks: int
    bad_blocks: list[dict[str, Any]] = field(default_factory=list)
    n_bad: int = 0  # bad blocks, all of them (bad_blocks lists the first MAX_BAD_BLOCKS)
    dequant_absmax: float | None = None  # over the finite dequantized values; None when there are none
    overflows: dict[str, bool | None] = field(default_factory=dict)  # non-finite or past the dtype's max
    #: non-finite values after dequantization (every value of a block with a NaN/Inf scale: 0 x inf is NaN;
    #: the data's own NaN/Inf codes are added by the weights scan); None when the count is not known
    dequant_nonfinite: int | None = 0
    nonfinite_blocks: int = 0  # blocks whose scale (or dmin, or global scale) makes every value non-finite
    skipped: str | None = None  # why it could not be checked (then it is listed in weights.unchecked)
    n_faults: int = 0  # bad blocks that are faults (all of them, listed or not)
    stripes_read: int = 0  # how many stripes of data were read to answer (for the benchmark)

    @property
    def faulty(self) -> bool:
        return self.n_faults > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": self.format,
            "scale": self.scale,
            "n_blocks": self.n_blocks,
            "bad_blocks": self.bad_blocks,
            "n_bad": self.n_bad,
            "dequant_absmax": self.dequant_absmax,
            "dequant_nonfinite": self.dequant_nonfinite,
            "overflows": self.overflows,
        }


def is_fault(entry: dict[str, Any], block: dict[str, Any]) -> bool:
    """Whether one ``bad_blocks`` entry of a ``weights.quantized`` entry is a fault: every problem
    but a negative weight scale (a sign some formats use on purpose); for an activation, KV or
    global scale (``format: "scale"``) a negative value is a fault too."""
    return block["problem"] != "negative" or entry.get("format") == "scale"


def severity(entry: dict[str, Any]) -> int:
    """How bad a ``weights.quantized`` entry's faults are, worst first: 0 a NaN/Inf scale (values become
    NaN/Inf), 1 a zero scale on data (values become 0), 2 anything else (a zero point, a negative scale)."""
    problems = {b["problem"] for b in entry["bad_blocks"] if is_fault(entry, b)}
    return 0 if problems & {"nan", "inf"} else 1 if "zero" in problems else 2


@dataclass
class Context:
    """What ``detect`` reads: tensor names, dtype tags and shapes, ``quantization_config``; and what it
    writes: claimed names and unchecked tensors."""

    ck: Checkpoint
    qc: dict[str, Any]
    names: set[str]
    claimed: set[str] = field(default_factory=set)
    unchecked: list[dict[str, str]] = field(default_factory=list)
    _tags: dict[str, str] = field(default_factory=dict)

    def tag(self, name: str) -> str:
        """The safetensors dtype tag of ``name`` (torch's dtype mapped to a tag for ``.pt`` files)."""
        t = self._tags.get(name)
        if t is None:
            t = self._tags[name] = self.ck.tag_of(name)
        return t

    def shape(self, name: str) -> list[int]:
        e = self.ck.entry(name)
        return list(e.shape) if e is not None else list(self.ck.tensor(name).shape)

    def free(self, name: str) -> bool:
        """``name`` exists and no format has claimed it yet."""
        return name in self.names and name not in self.claimed

    def claim(self, *names: str | None) -> None:
        self.claimed.update(n for n in names if n)

    def skip(self, name: str, dtype: str, reason: str, *also: str | None) -> None:
        """``name`` is a quantized weight that cannot be checked: listed in ``weights.unchecked``."""
        self.unchecked.append({"name": name, "dtype": dtype, "reason": reason})
        self.claim(name, *also)


class QuantFormat(Protocol):
    """A quantized format: detect its weights, give their scales, dequantize a window of stripes."""

    name: str  # registry key, e.g. "gptq"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        """The weights of this format in the checkpoint (claiming their tensors in ``ctx``)."""

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:
        """The scales of ``q`` as ``grade`` judges them."""

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:
        """Stripes ``first .. first + count`` dequantized: ``(block indices int64, largest |code - zero|
        float32)`` for every block they hold (several pairs may come, none overlapping); a third item,
        when given, says which blocks hold data (else: a magnitude above 0)."""


def rows_cols(shape: list[int] | tuple[int, ...]) -> tuple[int, int]:
    """(leading dims flattened, last dim): the rows and columns of a weight as stored."""
    if not shape:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]


def block_of(n: int, n_scales: int, given: int | None) -> int | None:
    """Elements per block along a dim of ``n`` elements with ``n_scales`` scales."""
    if given and -(-n // given) == n_scales:
        return given
    if n_scales <= 0:
        return None
    b = 1
    while -(-n // b) > n_scales:
        b *= 2
    return b if -(-n // b) == n_scales else (n // n_scales if n % n_scales == 0 else None)


def unravel(flat: int, shape: list[int]) -> list[int]:
    out = []
    for n in reversed(shape):
        out.append(flat % n if n else 0)
        flat //= n if n else 1
    return out[::-1]


def float32_values(tag: str, a: np.ndarray, e8m0: bool = False) -> np.ndarray:
    """Values of ``Checkpoint.array`` output ``a`` of tag ``tag`` as float32, flattened, as a cast to
    float32 gives them (F64 rounded to nearest; BF16 and fp8 decoded from their bits, exactly), uint8
    exponent bytes decoded as E8M0 with ``e8m0``."""

    a = a.reshape(-1)
    if tag == "F8_E8M0" or (e8m0 and tag == "U8"):
        return e8m0_values(a, 127)
    if tag in FLOATS:
        with np.errstate(over="ignore"):  # an F64 scale beyond float32's range is inf, as a cast makes it
            values: np.ndarray = FLOATS[tag].float32(FLOATS[tag].bits(a)).astype(np.float32, copy=True)
        return values
    if tag in FP8_TAGS:
        decoded: np.ndarray = float32_table(tag)[a]
        return decoded
    return a.astype(np.float32)


def e8m0_values(codes: np.ndarray, bias: int) -> np.ndarray:
    """float32 ``2**(code - bias)`` of uint8 exponent codes, exactly; 0xFF is NaN."""
    with np.errstate(over="ignore"):  # 0xFF's power overflows: it is NaN anyway
        x = np.ldexp(np.float32(1.0), codes.astype(np.int32) - bias)
    return np.where(codes == 0xFF, np.float32(math.nan), x)


def scale_values(ck: Checkpoint, name: str, e8m0: bool = False) -> np.ndarray:
    """A scale tensor as float32, flattened (E8M0 bytes decoded: ``2**(s - 127)``, 0xFF is NaN)."""
    return float32_values(ck.tag_of(name), ck.array(name), e8m0)
