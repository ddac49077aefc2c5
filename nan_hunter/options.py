"""Each option defined once: a field of a frozen option group that carries its flag.

An option of ``scan``, ``bisect`` or ``check`` is one dataclass field made by ``option(...)``: its
default, and in its metadata the command line's flag (name, metavar, help, panel, how the string is
parsed). The typer parameters are generated from the fields (``cli/options.command``), the API
functions' keywords, defaults and docstring lines are held against them both ways
(tests/unit/test_options.py), and the validation lives in the group's ``check_*`` methods. Choices are
``StrEnum``s whose values are the strings users type (``"modules"``, ``"ops"``), so a value compares
equal to its string and nothing a user passes changes.

Light on purpose: ``nanhunter --help`` reads these fields, so nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import Field, dataclass, field, fields
from enum import StrEnum
from typing import Any

from .errors import BadInput


class Panel(StrEnum):
    """The help panels, in the order they appear in ``--help``."""

    MODEL = "Model: how it is built"
    INPUTS = "Inputs: one per file, prompt or line"
    RUN = "Precision and device"
    MODE = "What to run"
    OUTPUT = "Output"


class StatsLevel(StrEnum):
    """``--stats``: sampled underflow statistics, or exact ones."""

    FAST = "fast"
    FULL = "full"


class TraceLevel(StrEnum):
    """``--trace-level``: one trace entry per module call, or per aten op."""

    MODULES = "modules"
    OPS = "ops"


class CompileBackend(StrEnum):
    """``--compile-backend``: the ``torch.compile`` backend a compiled run uses."""

    INDUCTOR = "inductor"
    AOT_EAGER = "aot_eager"
    EAGER = "eager"


class Granularity(StrEnum):
    """``bisect --granularity``: the candidates, leaf modules or whole transformer blocks."""

    LEAF = "leaf"
    BLOCK = "block"


class Over(StrEnum):
    """``bisect --over``: a minimal set of modules to keep, or which inputs fail."""

    MODULES = "modules"
    INPUTS = "inputs"


class KeepDtype(StrEnum):
    """``bisect --keep-dtype``: the precision kept modules run in."""

    FP32 = "fp32"
    BF16 = "bf16"


def choices(enum: type[StrEnum]) -> str:
    """A choice's metavar, ``modules|ops``: the enum's values in order."""
    return "|".join(m.value for m in enum)


def choice(enum: type[StrEnum], value: Any, refusal: str) -> str | None:
    """``value`` checked against ``enum`` and given back as its plain string (None stays None), so
    what is stored, written to YAML or JSON and compared is the string users typed; anything else
    exits 2 with ``refusal`` (the one line the flag has always said: ``--over x: use modules or
    inputs``)."""
    if value is None:
        return None
    try:
        return enum(value).value
    except ValueError:
        raise BadInput(refusal) from None


@dataclass(frozen=True)
class Flag:
    """How one option appears on the command line."""

    names: tuple[str, ...]  # ("--prompt",); a flag taking no value: ("--backward",) with metavar None
    help: str  # the --help text (its default is appended as argparse did, unless the text states it)
    panel: Panel
    metavar: str | None = None  # None: a flag, it takes no value
    number: type | None = None  # int or float: the string converted with argparse's refusal
    repeatable: bool = False  # given several times; the field holds a tuple
    param: str | None = None  # the CLI parameter's name where it is not the field's (--prompt: prompt)
    inverted: bool = False  # --no-replay: the field is the flag's negation (replay=False)

    @property
    def cli_name(self) -> str:
        return self.param or self.names[0].lstrip("-").replace("-", "_")


def option(
    default: Any,
    *names: str,
    help: str,
    panel: Panel,
    metavar: str | None = None,
    number: type | None = None,
    repeatable: bool = False,
    param: str | None = None,
    inverted: bool = False,
) -> Any:
    """A dataclass field that is an option: ``default`` (stated in ``--help`` as ``(default: X)``
    unless the help says it) and the flag ``names`` with their help; the group's ``check_*``
    methods validate the value."""
    flag = Flag(names, help, panel, metavar, number, repeatable, param, inverted)
    if isinstance(default, (list, dict, set)):
        raise TypeError("an option's default is immutable (a tuple, not a list)")
    return field(default=default, metadata={"flag": flag})


def flag_of(f: Field) -> Flag | None:
    """The flag a field carries, or None for a field that is no option (``checkpoint``, derived ones)."""
    return f.metadata.get("flag")


def option_fields(cls: type) -> Iterator[tuple[Field, Flag]]:
    """The options of an option group (or of a class made of groups), in help order: by panel,
    then in field order."""
    order = list(Panel)
    flagged = [(f, fl) for f in fields(cls) if (fl := flag_of(f)) is not None]
    return iter(sorted(flagged, key=lambda x: order.index(x[1].panel)))


def values_from_cli(cls: type, args: Any) -> dict[str, Any]:
    """The group's keyword arguments from the parsed command line (``cli.options.namespace``): a flag
    not given keeps the field's default; a repeatable one becomes a tuple; ``--no-replay`` is
    ``replay=False``."""
    out: dict[str, Any] = {}
    for f, fl in option_fields(cls):
        v = getattr(args, fl.cli_name, None)
        if v is None or (fl.metavar is None and v is False):
            continue
        out[f.name] = (not v) if fl.inverted else tuple(v) if fl.repeatable else v
    return out
