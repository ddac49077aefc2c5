"""``nanhunter diff`` in the terminal: the verdict, whether the difference reached the outputs
and the environment keys that differ first (three lines), then the details; every line at most ``WIDTH`` columns (80), every string from a trace escaped
(``escape.terminal``) and shortened with an ellipsis where it would not fit."""

from __future__ import annotations

import math
import os
from dataclasses import fields
from typing import Any

from ..divergence.compare import DiffResult
from .escape import terminal as esc

WIDTH = 80


def _cut(s: str, n: int) -> str:
    """``s`` in at most ``n`` columns: the middle replaced by an ellipsis (names keep both ends)."""
    if len(s) <= n:
        return s
    if n <= 1:
        return s[:n]
    head = (n - 1) // 2
    return s[:head] + "…" + s[len(s) - (n - 1 - head) :]


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3e}" if x != 0 else "0"


def _err(x: float | None) -> str:
    return "inf" if x is None or math.isinf(x) else "0" if x == 0 else f"{x:.2e}"


def _where(d: dict[str, Any]) -> str:
    name = esc(d["module"]) or "<root>"
    return f"{name} ({esc(d['module_type'])})"


def _source(d: dict[str, Any]) -> str | None:
    if not d.get("source_file"):
        return None
    return f"{esc(os.path.basename(d['source_file']))}:{d.get('source_line')}"


def _value(v: Any) -> str:
    return esc("null" if v is None else v)


def _what(d: dict[str, Any], room: int = WIDTH) -> str:
    """``module (Type) · op``, or ``module (Type) (no counterpart)`` for a region, in ``room``
    columns: the module path loses its middle first, so its leaf (the name that decides) stays."""
    tail = (f" · {esc(d['op'])}" if d.get("op") else "") + (" (no counterpart)" if d.get("unmatched") else "")
    name = esc(d["module"]) or "<root>"
    typed = f" ({esc(d['module_type'])})" if d.get("module_type") else ""
    if len(name) + len(typed) + len(tail) > room:
        typed = ""  # the type goes before the name is shortened
    return _cut_path(name, max(room - len(typed) - len(tail), 16)) + typed + tail


def _cut_path(name: str, n: int) -> str:
    """A dotted module path in ``n`` columns: whole components dropped from the middle (``model.…
    mlp.down_proj``), the leaf always kept (cut in its middle only when it alone is too long)."""
    if len(name) <= n:
        return name
    parts = name.split(".")
    for keep in range(len(parts) - 1, 0, -1):
        text = (parts[0] + ".…." if len(parts) - keep > 1 else "….") + ".".join(parts[-keep:])
        if len(text) <= n:
            return text
    return _cut(name, n)


def _short_op(op: str) -> str:
    """``aten.addmm.default`` → ``addmm`` (the overload kept when it is not ``default``)."""
    parts = op.split(".")
    if len(parts) == 3 and parts[0] == "aten":
        return parts[1] if parts[2] == "default" else f"{parts[1]}.{parts[2]}"
    return op


def _op_list(ops: list[str], room: int) -> str:
    """Op names, comma-separated, as many as fit in ``room`` columns, then ``+N more``."""
    if not ops:
        return "(none)"
    names = [esc(_short_op(x)) for x in ops]
    for k in range(len(names), 0, -1):
        text = ", ".join(names[:k]) + (f", +{len(names) - k} more" if k < len(names) else "")
        if len(text) <= room:
            return text
    return _cut(names[0], room - len(f", +{len(names) - 1} more")) + f", +{len(names) - 1} more"


def _region_lines(d: dict[str, Any]) -> list[str]:
    if not d.get("unmatched"):
        return []
    head = "  no counterpart in A: "
    out = [
        f"  no counterpart in {side.upper()}: " + _op_list(d["unmatched"][side], WIDTH - len(head))
        for side in ("a", "b")
    ]
    at = d.get("compared_at") or {}
    out.append(
        _cut(
            f"  measured at the next paired entry: {esc(at.get('module')) or '<root>'}"
            + (f" · {esc(at['op'])}" if at.get("op") else ""),
            WIDTH,
        )
    )
    return out


def _outputs_line(res: dict[str, Any]) -> str:
    """Line 2: whether the difference reached the model's outputs."""
    o = res.get("outputs")
    d = res["first_divergence"]
    inside = d is not None or res["first_nonfinite"]["a"] != res["first_nonfinite"]["b"]
    if o is None:
        return "  outputs: not known (see the notes)"
    tol = f"{o['tolerance']:.1e}" if o.get("tolerance") is not None else "—"
    if o["equal"] == "bitwise":
        return "  outputs bitwise equal" + (": the divergence did not reach them" if inside else "")
    if o["equal"] == "within_tolerance":
        return f"  outputs within tolerance (rel_err {_err(o['rel_err'])} ≤ {tol})" + (
            ": the divergence did not reach them" if inside else ""
        )
    if o.get("unpaired"):
        return f"  outputs differ: {o['unpaired']} root call(s) with outputs that have no counterpart"
    err = "non-finite classes differ" if o["rel_err"] is None else f"rel_err {_err(o['rel_err'])} > {tol}"
    return f"  outputs differ: {err}"


def lines(res: dict[str, Any]) -> list[str]:
    """The terminal view of a ``nanhunter.diff/v1`` dict (``DiffResult.to_dict()``)."""
    out: list[str] = []
    d = res["first_divergence"]
    fa, fb = res["first_nonfinite"]["a"], res["first_nonfinite"]["b"]
    env = res["env_diff"]
    if d is not None:
        head = f"{'✘' if res['exit_code'] else '⚠'} runs part at "
        out.append(_cut(head + _what(d, WIDTH - len(head)), WIDTH))
    elif (fa is None) != (fb is None):
        side, e = ("A", fa) if fa is not None else ("B", fb)
        out.append(
            _cut(
                f"✘ only {side} is non-finite: {esc(e['kind'])} first at {esc(e['module']) or '<root>'}"
                + (f" · {esc(e['op'])}" if e.get("op") else ""),
                WIDTH,
            )
        )
    elif res.get("first_difference"):
        head = "✔ within tolerance; first differs at "
        out.append(_cut(head + _what(res["first_difference"], WIDTH - len(head)), WIDTH))
    else:
        out.append(
            _cut(
                f"✔ no divergence: {res['compared']} entries agree within tolerance "
                f"(max rel_err {_err(res['max_rel_err']) if res['max_rel_err'] is not None else '—'})",
                WIDTH,
            )
        )
    out.append(_cut(_outputs_line(res), WIDTH))
    out.append(_env_line([esc(x["key"]) for x in env]))
    out.append("")
    out.append(_cut(f"A  {esc(res['a']['path'])}", WIDTH))
    out.append(_cut(f"B  {esc(res['b']['path'])}", WIDTH))
    if d is not None:
        out.append("")
        out.append(_cut(f"first divergence  {_where(d)}", WIDTH))
        out.append(
            _cut(
                f"  call {d['call_index']} · input {d['input_index']} · step {d['step']} · {esc(d['phase'])}",
                WIDTH,
            )
        )
        if d.get("op"):
            out.append(_cut(f"  op      {esc(d['op'])}", WIDTH))
        out += _region_lines(d)
        src = _source(d)
        if src:
            out.append(_cut(f"  source  {src}", WIDTH))
        rel = (
            f"non-finite classes differ (tolerance {d['tolerance']:.1e})"
            if d["classes_differ"]
            else f"rel_err {_err(d['rel_err'])} > tolerance {d['tolerance']:.1e}"
        )
        out.append(_cut(f"  {rel} · inputs {'agree' if d['inputs_agree'] else 'differ too'}", WIDTH))
        out.append(f"  {'':<3}{'absmax':>12}{'mean':>12}{'l2':>12}  {'nan/+inf/-inf':<15}{'hash':<8}")
        for side in ("a", "b"):
            s = d[side]
            counts = f"{s['nan']}/{s['posinf']}/{s['neginf']}"
            out.append(
                _cut(
                    f"  {side.upper():<3}{_num(s['absmax']):>12}{_num(s['mean']):>12}{_num(s['l2']):>12}  "
                    f"{_cut(counts, 14):<15}{esc(s['hash'] or '—')}",
                    WIDTH,
                )
            )
    fd = res.get("first_difference")
    if fd is not None and (
        d is None or (fd["module"], fd["op"], fd["a"]["index"]) != (d["module"], d["op"], d["a"]["index"])
    ):
        out.append("")
        at = "" if fd.get("unmatched") else f" (#{fd['a']['index']})"
        out.append(_cut(f"first difference (bits)  {_what(fd, WIDTH - 25 - len(at))}{at}", WIDTH))
        out.append("  the first entry whose bits differ while its inputs' bits do not")
        out += _region_lines(fd)
    if env:
        out.append("")
        rows = [(_cut(esc(x["key"]), 24), _cut(_value(x["a"]), 24), _value(x["b"])) for x in env[:12]]
        kw = max(8, min(24, max(len(k) for k, _, _ in rows)))  # columns line up under the header
        aw = min(24, max(1, *(len(a) for _, a, _ in rows)))
        out.append(f"{'environment':<{kw + 4}}{'A':<{aw}} | B")
        for k, a, b in rows:
            out.append(_cut(f"  {k:<{kw}}  {a:<{aw}} | {b}", WIDTH))
        if len(env) > 12:
            out.append(f"  … {len(env) - 12} more (see --json)")
    out.append("")

    def nf(e: dict[str, Any] | None) -> str:
        if e is None:
            return "none"
        return (
            f"{esc(e['kind'])} at {esc(e['module']) or '<root>'}"
            + (f" {esc(e['op'])}" if e.get("op") else "")
            + f" (#{e['index']})"
        )

    out.append(_cut(f"first non-finite  A: {nf(fa)}", WIDTH))
    out.append(_cut(f"                  B: {nf(fb)}", WIDTH))
    ua, ub = res["unmatched"]["a"], res["unmatched"]["b"]
    out.append(
        _cut(f"compared {res['compared']} {res['level']}-level entries · unmatched A {ua} · B {ub}", WIDTH)
    )
    for n in res.get("notes") or []:
        out += _wrap(f"note: {esc(n)}")
    return out


def _env_line(keys: list[str]) -> str:
    """``  environment differs: a, b, c, +2 more`` in ``WIDTH`` columns (whole keys only)."""
    if not keys:
        return "  environment: the same"
    head = "  environment differs: "
    shown: list[str] = []
    for i, k in enumerate(keys):
        rest = len(keys) - i - 1
        tail = f", +{rest} more" if rest else ""
        line = head + ", ".join(shown + [k]) + tail
        if len(line) > WIDTH:
            if not shown:
                return _cut(head + k, WIDTH - len(f", +{len(keys) - 1} more")) + (
                    f", +{len(keys) - 1} more" if len(keys) > 1 else ""
                )
            return head + ", ".join(shown) + f", +{len(keys) - len(shown)} more"
        shown.append(k)
    return head + ", ".join(shown)


def _wrap(text: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_long_words=True) or [""]


def render(res: dict[str, Any]) -> str:
    return "\n".join(line.rstrip() for line in lines(res)) + "\n"


class PrintableDiff(DiffResult):
    """A ``DiffResult`` that prints as ``nanhunter diff`` does in the terminal (``print(diff)``)."""

    def render(self) -> str:
        return render(self.to_dict())

    def __str__(self) -> str:
        return self.render()


def printable(res: DiffResult) -> PrintableDiff:
    """``res``'s fields (shared, not copied) in a ``PrintableDiff``."""
    return PrintableDiff(**{f.name: getattr(res, f.name) for f in fields(res)})
