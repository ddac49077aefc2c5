"""Errors that mean "bad usage or bad input": the CLI prints the message on one line, exit 2."""


class BadInput(Exception):
    """What is wrong and how to fix it, in one line."""
