"""Capture: hooks that record what every module call took and returned, as statistics rows.

Capture only records (``recorder.Recorder``: calls and rows; ``ops``: op-level events under a
dispatch mode); finding the fault in the records is ``locate``'s job.
"""
