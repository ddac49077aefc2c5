"""The report's plot (optional extra ``plot``: matplotlib, Agg, no pyplot state): output absmax
per module call on a log scale against the fp16/fp8 limits, the first producer marked and
non-finite outputs clipped to the top. Weights-only reports plot absmax per tensor instead."""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

from ..dtypes import limits
from ..errors import install_hint
from ..report import Report
from . import escape
from .rows import Row, module_name, producer_index

MISSING = f"plot omitted: matplotlib is not installed ({install_hint('plot')})"
# Limits drawn on every plot (values from torch.finfo via dtypes.limits).
LIMIT_LINES = (("fp16", "tab:red"), ("fp8-e5m2", "tab:purple"), ("fp8-e4m3", "tab:orange"))
KIND_MARK = {
    "nan": ("X", "crimson", "NaN"),
    "posinf": ("^", "darkmagenta", "+inf"),
    "neginf": ("v", "navy", "−inf"),
}
Plot = tuple[bytes | None, str | None]  # (PNG, None) or (None, why there is none)


class PlotUnavailable(RuntimeError):
    """matplotlib is missing; the message says how to install it."""


def _figure():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(MISSING) from None
    # A bare Figure renders through Agg by itself and leaves pyplot's global backend alone.
    fig = Figure(figsize=(11, 4.6), dpi=110, layout="constrained")
    return fig, fig.add_subplot()


def _kind(row: Row) -> str | None:
    return (
        "nan"
        if row.get("nan")
        else "posinf"
        if row.get("posinf")
        else "neginf"
        if row.get("neginf")
        else None
    )


def _draw_limits(ax, xmax: float) -> None:

    for i, (dt, color) in enumerate(LIMIT_LINES):
        y = limits(dt).max
        ax.axhline(y, color=color, lw=1, ls="--", alpha=0.8)
        # fp16 and e5m2 are 0.06 decades apart: put one label above its line, the other below.
        ax.text(
            xmax,
            y,
            f"{dt} max {y:.6g}",
            color=color,
            fontsize=8,
            ha="right",
            va="top" if i == 1 else "bottom",
        )


def _points(ax, xs: Sequence[float], ys: list[float | None], kinds: list[str | None], ylabel: str) -> float:
    """Finite points on a log axis, non-finite ones clipped to a band above them; returns the clip height."""
    fin = [(x, y) for x, y, k in zip(xs, ys, kinds) if k is None and y]
    top = max([65504.0] + [y for _, y in fin])
    clip = top * 30
    if fin:
        ax.plot([x for x, _ in fin], [y for _, y in fin], color="0.6", lw=0.8, zorder=1)
        ax.scatter(
            [x for x, _ in fin], [y for _, y in fin], s=14, color="tab:blue", zorder=2, label="finite absmax"
        )
    for kind, (marker, color, text) in KIND_MARK.items():
        sel = [x for x, k in zip(xs, kinds) if k == kind]
        if sel:
            ax.scatter(
                sel,
                [clip] * len(sel),
                marker=marker,
                s=46,
                color=color,
                zorder=3,
                label=f"{text} (clipped to top)",
            )
    if any(kinds):
        ax.axhspan(clip / 3, clip * 3, color="mistyrose", alpha=0.5, zorder=0)
        ax.text(
            0.005,
            clip,
            " non-finite ",
            transform=ax.get_yaxis_transform(),
            fontsize=8,
            color="darkred",
            va="center",
            ha="left",
        )
    ax.set_yscale("log")
    lows = [y for _, y in fin]
    ax.set_ylim(min(lows + [1.0]) / 10, clip * 3)
    ax.set_ylabel(ylabel)
    return clip


def _ticks(ax, xs: list[int], names: list[str]) -> None:
    """Tick labels for up to 40 points: escaped, long names keep their tail (the leaf)."""
    if len(names) <= 40:
        shown = [escape.plot(n if len(n) <= 28 else "…" + n[-27:]) for n in names]
        ax.set_xticks(xs, shown, rotation=60, ha="right", fontsize=7)
    ax.set_xlim(-0.8, max(xs, default=0) + 0.8)


def _mark(ax, x: int, y: float, text: str, n: int) -> None:
    ax.axvline(x, color="red", lw=1.6, alpha=0.75, zorder=1)
    ax.scatter([x], [y], s=160, facecolors="none", edgecolors="red", linewidths=2, zorder=4)
    left = x > n * 0.6
    ax.annotate(
        text,
        xy=(x, y),
        xytext=(-12 if left else 12, -28),
        textcoords="offset points",
        ha="right" if left else "left",
        fontsize=9,
        color="red",
        fontweight="bold",
        arrowprops={"arrowstyle": "->", "color": "red"},
        bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "red", "alpha": 0.9},
    )


def modules_figure(rep: Report):
    rows = rep.modules or []
    fig, ax = _figure()
    xs = list(range(len(rows)))
    kinds = [_kind(r) for r in rows]
    clip = _points(ax, xs, [r.get("absmax") for r in rows], kinds, "output absmax (log)")
    _draw_limits(ax, len(rows) - 0.5)
    multi = len({r["input_index"] for r in rows}) > 1
    for i in range(1, len(rows)):
        if rows[i]["input_index"] != rows[i - 1]["input_index"]:
            ax.axvline(i - 0.5, color="0.4", ls=":", lw=1)
            ax.text(i - 0.4, clip * 2, f"input #{rows[i]['input_index']}", fontsize=7, color="0.3", va="top")
    names = [(f"#{r['input_index']} " if multi else "") + module_name(r["module"]) for r in rows]
    _ticks(ax, xs, names)
    p, f = producer_index(rep), rep.first_nonfinite
    if p is not None and f is not None:  # a producer row is the first non-finite value's
        p_ = escape.plot
        _mark(
            ax,
            p,
            clip,
            f"first non-finite: {p_(module_name(f.module))} ({p_(f.module_type)})\n"
            f"{p_(f.op or '?')} → {p_(f.kind)}",
            len(rows),
        )
    dt = escape.plot(rep.run_fact("dtype") or "?")
    ax.set_title(
        f"output absmax per module call, execution order ({len(rows)} calls, run in {dt})", fontsize=11
    )
    ax.set_xlabel("module call (execution order)")
    ax.legend(loc="lower left", fontsize=8, framealpha=0.9)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    return fig


def weights_figure(rep: Report):
    ts = [t for t in (rep.weights or {}).get("tensors") or [] if not t.get("skipped")]
    if not ts:
        return None
    fig, ax = _figure()
    xs = list(range(len(ts)))
    kinds = [_kind(t) for t in ts]
    clip = _points(ax, xs, [t.get("absmax") for t in ts], kinds, "|w| max (log)")
    _draw_limits(ax, len(ts) - 0.5)
    _ticks(ax, xs, [t["name"] for t in ts])
    first = next((i for i, k in enumerate(kinds) if k is not None), None)
    if first is not None:
        _mark(ax, first, clip, f"first non-finite tensor: {escape.plot(ts[first]['name'])}", len(ts))
    ax.set_title(
        f"weights absmax per tensor, checkpoint order ({len(ts)} floating tensors; no forward was run)",
        fontsize=11,
    )
    ax.set_xlabel("tensor")
    ax.legend(loc="lower left", fontsize=8, framealpha=0.9)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    return fig


def plot_png(rep: Report) -> bytes | None:
    """The report's plot as PNG bytes; None when there is nothing to plot. Raises PlotUnavailable
    when matplotlib is missing."""
    fig = modules_figure(rep) if rep.modules else weights_figure(rep)
    if fig is None:
        return None
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # A name in a script the font lacks draws as a box; matplotlib's warning about it would
        # print the name (untrusted) on stderr.
        warnings.simplefilter("ignore", UserWarning)
        fig.savefig(buf, format="png")
    return buf.getvalue()


def plot_or_note(rep: Report) -> Plot:
    """(PNG bytes, None), or (None, why there is no plot)."""
    try:
        png = plot_png(rep)
    except PlotUnavailable as e:
        return None, str(e)
    return (png, None) if png else (None, "nothing to plot: no module outputs and no floating-point weights")
