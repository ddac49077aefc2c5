"""Early warning from a sentinel watch's sampled statistics: the overflow forecast (``overflow``,
fitted by ``fit``) and the named precursors of an instability (``precursors``, one rule class
each behind a registry). Analysis only: what is recorded, and when, is ``capture.signals``'."""
