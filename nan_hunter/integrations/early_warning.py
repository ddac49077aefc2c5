"""The forecast and the precursor warnings as a framework logs them: scalars named
``nanhunter/<what>/<module>/<signal>/<dtype>`` (TensorBoard's and CSV loggers' slash-separated
tags) and one log line per new warning. Read from the watch at a framework's log step (the
forecast is fitted then: nothing is added to a training step)."""

from __future__ import annotations

from typing import Any

from ..config import default_config


def scalars(watch: Any) -> dict[str, float]:
    """The top ``forecast.max_listed`` forecast entries' headroom (dB), rate (dB per 100 steps) and
    projected crossing step, and how many warnings were raised so far; empty before a step was sampled."""
    fc = watch.forecast() if watch is not None and getattr(watch, "signals", None) is not None else None
    if fc is None:
        return {}  # no step sampled yet: nothing is added to the framework's logs
    out: dict[str, float] = {"nanhunter/warnings": float(len(watch.precursors()))}
    for e in fc[: default_config().forecast.max_listed]:
        tag = f"{e['module'] or 'root'}/{e['signal']}/{e['dtype']}"
        out[f"nanhunter/headroom_db/{tag}"] = float(e["headroom_db"])
        out[f"nanhunter/rate_db_per_100_steps/{tag}"] = float(e["rate_db_per_100_steps"])
        if e["projected_step"] is not None:
            out[f"nanhunter/projected_step/{tag}"] = float(e["projected_step"])
    return out


class WarningLog:
    """Each precursor warning said once, as one line (``nanhunter: warning <code> ...``)."""

    def __init__(self) -> None:
        self.said = 0

    def new_lines(self, watch: Any) -> list[str]:
        if watch is None or getattr(watch, "signals", None) is None:
            return []
        found = watch.precursors()
        new, self.said = found[self.said :], len(found)
        return [
            f"nanhunter: warning {w.code} at step {watch.policy.label(w.step)}"
            + (f" in {w.module}" if w.module else "")
            + f": {'; '.join(w.evidence)} — fix: {w.fix}"
            for w in new
        ]
