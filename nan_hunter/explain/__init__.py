"""Explain: from a located fault to the report's answer.

- ``replay``: the failing region re-run in every dtype against float64
- ``diagnose``: rules → cause, evidence, fix
- ``compare``: the one comparison of two runs' outputs (its NaN/±inf policy stated there)
- ``assemble``: the one assembler of a report from a finding
"""
