"""Serving: continuous batching's packed forwards read per request (``packed``), one request
replayed alone (``alone``), a watch's view and ``on_fault="abort"`` (``tracker``), and the report's
``run.requests``/``run.evict`` (``outcome``)."""
