"""Load: what comes in from disk, read-only and bounded.

- ``checkpoint``: a ``.safetensors`` file, a sharded index, a Hugging Face directory or a
  ``torch.save`` file, as one ``Checkpoint``
- ``safetensors_header``, ``safetensors_file``: the strict header parser and bounded read-only windows
- ``regular_file``, ``bounded_json``, ``torch_checkpoint``: safe file and JSON reading, ``weights_only`` pickles
- ``weights``: the static weights scan (NaN/Inf, headroom, underflow per tensor), on numpy: no torch
- ``float_bits``, ``bit_dtypes``: floats read from their bits; fp8, fp4 and fp6 from their codes
- ``capsule``: the capsule format (a failing training step written at the fault)
"""
