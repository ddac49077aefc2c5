"""Command line: parse flags, check outputs, call the library, render. Nothing else.

One module per command (``scan_cmd``, ``bisect_cmd``, ``check_cmd``), the flags they share
(``options``), what they print and write (``output``), Ctrl-C handling (``interrupts``) and the
entry point (``main``). Stdlib ``argparse``: parsing costs a few milliseconds, so ``nanhunter
--help`` is instant and a scan's wall time is the scan's.
"""
