"""Pipeline: the commands as library functions.

- ``scan_checkpoint``: ``nanhunter scan`` (load → weights scan → model + inputs → harness → report)
- ``ci_check``: ``nanhunter check`` (rules over scans, for CI)
"""
