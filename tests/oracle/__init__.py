"""An oracle beside the tool: a small truth tracer (``truth.py``) and the tiny real models with
planted faults it is run on (``planted.py``); where two runs part (``parting.py``: its own op
tape and the contract's rules for ``nanhunter diff``). Nothing here imports ``nan_hunter`` (checked by
``tests/unit/test_oracle_independent.py``): it re-derives module, op, kind, step, phase, position,
cause and the evidence numbers its own way, so the matrix test can hold nanhunter against it."""
