"""Quantized weights: one ``QuantFormat`` per module, registered in ``registry.FORMATS``; ``grade``
judges the scales and reads only the data it needs.

- ``base``: the protocol, ``QuantizedWeight``, ``Blocks``, ``QuantizedScan``, ``Context``
- ``grade``: bad blocks, dequantized absmax, fp16/bf16 overflow, window by window
- formats: ``fp8``, ``mxfp4``, ``nvfp4``, ``int_group``, ``gptq``, ``awq``, ``bnb``, ``gguf``, ``scales``
  (activation/KV/global scales), ``orphans`` (weights whose scales were not found)
"""
