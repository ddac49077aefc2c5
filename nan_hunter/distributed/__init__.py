"""Distributed: torch.distributed support.

- ``collectives``: JSON over tensors between ranks (never pickle)
- ``global_report``: ``watch().report()`` as a collective (one global answer on every rank)
(The CLI's data set split across torchrun ranks, a layer around the harness, is ``modes.rank_split``.)
"""
