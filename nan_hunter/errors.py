"""Errors that mean "bad usage or bad input": the CLI prints the message on one line, exit 2."""

import re

# control characters (C0, DEL, C1) and the Unicode line/paragraph separators: a file or shard name
# holding one would break the message over lines (or rewrite the terminal)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _one_line(text: str) -> str:
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def install_hint(extra: str) -> str:
    """How to add one of nanhunter's extras (``hf``, ``plot``, ``accelerate``, ``lightning``, ``gpu``):
    from the clone it was installed from — nanhunter is not on PyPI, so ``pip install
    'nan-hunter[hf]'`` would find nothing (or someone else's package)."""
    return f"pip install -e '.[{extra}]' in the nanhunter clone"


class BadInput(Exception):
    """What is wrong and how to fix it, in one line: control characters that came in with a
    name (a shard called ``"a\\nb"``) are escaped, so the message stays one line."""

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(_one_line(str(message)), *args)


class NonFiniteError(RuntimeError):
    """``watch(..., on_fault="raise")``: a non-finite value was found. ``.report`` is what
    ``report()`` returns at that point, fully explained (module, op, diagnosis)."""

    def __init__(self, report: object, message: str) -> None:
        super().__init__(message)
        self.report = report
