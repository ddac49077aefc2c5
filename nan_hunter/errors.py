"""Errors that mean "bad usage or bad input": the CLI prints the message on one line, exit 2."""


class BadInput(Exception):
    """What is wrong and how to fix it, in one line."""


class NonFiniteError(RuntimeError):
    """``watch(..., on_fault="raise")``: a non-finite value was found. ``.report`` is what
    ``report()`` returns at that point, fully explained (module, op, diagnosis)."""

    def __init__(self, report: object, message: str) -> None:
        super().__init__(message)
        self.report = report
