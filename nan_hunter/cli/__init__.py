"""Command line: parse flags, check outputs, call the library, render. Nothing else.

A typer application (``app``): one module per command (``scan_cmd``, ``bisect_cmd``,
``check_cmd``, ``diff_cmd``), the flags they share (``options``), usage errors said in one line
(``usage``), ``--version`` (``about``), what commands print and write (``output``), Ctrl-C
handling (``interrupts``) and the entry point (``main``). Torch, and everything that computes, is
imported only once a command runs: ``nanhunter --help`` loads typer and rich and nothing heavier.
"""
