"""A report as format-neutral rows: plain strings in lists and small records, shared by the
terminal, HTML and Markdown views so every format says the same thing and none recomputes what
another computes.

Strings here are raw (untrusted names included); each view escapes them for its sink with
``render.escape``. Nothing here measures anything: the numbers are the report's, formatted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..dtypes import RunDtype
from ..explain.fix_words import UNVERIFIED, no_mechanical_fix
from ..report import BisectResult, ModuleRow, Report, split_source
from ..version import __version__

#: Defaults of the configuration keys the views take as parameters (configs/default.yaml).
NEAR_MISS_MAX_LISTED = 10  # near_miss.max_listed
WEIGHTS_MAX_ROWS = 20  # weights.max_rows
FORECAST_MAX_LISTED = 5  # forecast.max_listed
WEIGHTS_TARGETS: tuple[str, ...] = ("fp16", "fp8-e4m3", "fp8-e5m2")  # weights.targets
LEAD_CALLS = 5  # calls shown before the producer
ROOT = "<root>"

ICON = {"pass": "✔", "warn": "!", "fail": "✘"}


def fmt(x: Any) -> str:
    """A number as every view prints it (4 significant digits), — for a missing one."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else "nan" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def share_of_max(share: float) -> str:
    """A value's share of a dtype's max: "12.50%", "2.1e-06" for a tiny one, and "6.26e+25x" for
    one past the max by far (a percentage of 28 digits says nothing)."""
    if math.isnan(share):
        return "—"
    if math.isinf(share) or share >= 10:
        return "inf" if math.isinf(share) else f"{share:.3g}x"
    return f"{share:.2%}" if share >= 1e-4 or share == 0 else f"{share:.1e}"


def size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} KB"


def module_name(name: str | None) -> str:
    return name or ROOT


#: a module row: typed (``report.ModuleRow``) or as its dict
Row = dict[str, Any] | ModuleRow


def is_bad(row: Row) -> bool:
    return bool(row.get("nan") or row.get("posinf") or row.get("neginf"))


def kind_of(row: Row) -> str | None:
    """ "NaN", "+inf", "−inf" for a row holding that, the first of them in this order; else None."""
    return "NaN" if row.get("nan") else "+inf" if row.get("posinf") else "−inf" if row.get("neginf") else None


# --- verdict ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    text: str
    tone: str  # ok | warn | bad


def results(rep: Report) -> list[dict[str, Any]]:
    """``check`` rule results (rule, checkpoint, status, message, details)."""
    return (rep.check or {}).get("results") or []


def check_label(rep: Report) -> str:
    """The checkpoint as the user named it (rule results carry it), else its resolved path."""
    rs = results(rep)
    return rs[0]["checkpoint"] if rs else str((rep.checkpoint or {}).get("path"))


def counts(reps: list[Report]) -> dict[str, int]:
    c = {"pass": 0, "warn": 0, "fail": 0}
    for rep in reps:
        for r in results(rep):
            c[r["status"]] += 1
    return c


def check_verdict(reps: list[Report], width: int = 0) -> Verdict:
    """One line for a whole ``check`` run: the failing rules by name first (per checkpoint when
    there are several), then the counts; at most ``width`` cells (default ``VERDICT_WIDTH``, the
    80-column limit; a wider console gives more), rules that do not fit counted as "+N more"."""
    width = width or VERDICT_WIDTH
    c = counts(reps)
    total = sum(c.values())
    failing = [
        (check_label(r), [x["rule"] for x in results(r) if x["status"] == "fail"])
        for r in reps
        if not (r.check or {}).get("passed")
    ]
    warns = f", {c['warn']} warning(s)" if c["warn"] else ""
    if not failing:
        return Verdict(
            cut_end(f"✔ check passed: {len(reps)} checkpoint(s), {total} rules{warns}", width),
            "warn" if c["warn"] else "ok",
        )
    tail = f" ({c['fail']} of {total} rules failed{warns}; {len(reps)} checkpoint(s))"
    names = [
        (f"{label}: " if len(reps) > 1 else "", rules or ["(no rule result)"]) for label, rules in failing
    ]
    flat = [(who if j == 0 else "", rule) for who, rules in names for j, rule in enumerate(rules)]
    for shown in range(len(flat), 0, -1):
        listed = "".join(
            ("; " if i and who else ", " if i else "") + who + rule
            for i, (who, rule) in enumerate(flat[:shown])
        )
        more = f" +{len(flat) - shown} more" if shown < len(flat) else ""
        for end in (tail, ""):
            line = f"✘ check failed: {listed}{more}{end}"
            if cells(line) <= width:
                return Verdict(line, "bad")
    return Verdict(cut_end(f"✘ check failed: {flat[0][0]}{flat[0][1]}", width), "bad")


#: The verdict line's width: it never wraps on an 80-column terminal (or a pipe read as one).
VERDICT_WIDTH = 79
KIND_WORD = {"nan": "NaN", "posinf": "+inf", "neginf": "−inf"}


def cells(s: str) -> int:
    """Terminal cells ``s`` takes (East Asian wide characters count 2), without importing rich."""
    import unicodedata

    return sum(
        2 if unicodedata.east_asian_width(ch) in "WF" else 0 if unicodedata.combining(ch) else 1 for ch in s
    )


def cut_end(s: str, width: int) -> str:
    """``s`` in at most ``width`` cells, "…" at the end when cut."""
    if cells(s) <= width:
        return s
    out = ""
    for ch in s:
        if cells(out + ch) > width - 1:
            break
        out += ch
    return out + "…"


def cut_middle(name: str, width: int, sep: str = ".") -> str:
    """A dotted name (or a path, ``sep="/"``) in at most ``width`` cells, "…" in the middle: whole
    components go from the middle while the layer index (the last all-digit component, with the
    component holding it) and the leaf stay (``model.layers.11.…output_projection_layer``,
    ``model.…layers.17.mlp.down_proj``); only a leaf wider than ``width`` is cut inside a word.
    The one style of every view (terminal, HTML, Markdown, verdict lines)."""
    if cells(name) <= width:
        return name
    if width <= 1:
        return "…"[: max(0, width)]
    best = elided(name, width, sep)
    if best is not None:
        return best
    kept, used = len(name), 0
    while kept and used + cells(name[kept - 1]) <= width - 1:
        kept -= 1
        used += cells(name[kept])
    return "…" + name[kept:]


#: a parameter's own name: shortened, ``mlp.down_proj.weight`` keeps ``down_proj.weight`` (and a quantized
#: weight's tensors their module: ``down_proj.weight_scale_inv``)
PARAMETER_LEAVES = (
    "weight",
    "bias",
    "weight_scale_inv",
    "weight_scale",
    "qweight",
    "qzeros",
    "scales",
    "absmax",
    "SCB",
    "input_scale",
)


def elided(name: str, width: int, sep: str = ".") -> str | None:
    """``name`` in at most ``width`` cells with whole components replaced by "…", or None when no
    such form fits.

    Components go one at a time, the one nearest the middle of the name first (its centre, in
    cells, nearest half the name's width): never the leaf (with its module for a parameter:
    ``down_proj.weight``) nor the layer index (the last all-digit component before it), and the
    index's parent (``layers`` of ``layers.11``) only once nothing else is left; neighbouring
    dropped components share one "…". Once the name fits, the cells left over go back to the
    components dropped before the last, the outermost first (each that still fits). The width after
    a drop or a restore follows from the component's two neighbours alone, and the order is a merge
    of the components left and right of the middle, so a name of n components costs O(n): no text
    is built before the one returned. When dropping all of them is not enough, the leaf alone
    (``…down_proj``)."""
    parts = name.split(sep)
    n = len(parts)
    if n < 2:
        return None
    leaf = 2 if n >= 3 and parts[-1] in PARAMETER_LEAVES else 1
    idx = next((i for i in range(n - leaf - 1, -1, -1) if parts[i].isdigit()), None)
    parent = idx - 1 if idx is not None and idx > 0 else None
    ls = cells(sep)
    w = [cells(p) for p in parts]
    total = sum(w) + (n - 1) * ls
    centre, at = [], 0
    for c in w:
        centre.append(at + c / 2)
        at += c + ls
    mid = total / 2
    free = [i for i in range(n - leaf) if i != idx and i != parent]
    k = next((j for j, i in enumerate(free) if centre[i] > mid), len(free))
    left, right = free[k - 1 :: -1] if k else [], free[k:]  # nearest the middle first on either side
    order: list[int] = []
    a = b = 0
    while a < len(left) or b < len(right):
        if b == len(right) or (a < len(left) and mid - centre[left[a]] <= centre[right[b]] - mid):
            order.append(left[a])
            a += 1
        else:
            order.append(right[b])
            b += 1
    if parent is not None:
        order.append(parent)
    dropped = [False] * n

    def change(i: int) -> int:
        """Cells dropping component ``i`` removes (restoring it adds), its neighbours as they are: a
        new "…" (one cell) that takes the separator after it; one more component of a run; two runs
        made one. The leaf is never dropped, so ``i + 1 < n``."""
        joins = (i > 0 and dropped[i - 1]) + dropped[i + 1]
        return w[i] + ls - 1 if joins == 0 else w[i] + ls if joins == 1 else w[i] + ls + 1

    length = total
    for last, i in enumerate(order):
        length -= change(i)
        dropped[i] = True
        if length <= width:
            # the cells left over go back to the components dropped before, the outermost first
            for j in reversed(order[:last]):
                dropped[j] = False
                if length + change(j) <= width:
                    length += change(j)
                else:
                    dropped[j] = True
            return "".join(
                ("" if i and dropped[i - 1] else (sep if i else "") + "…")
                if d
                else (sep if i and not dropped[i - 1] else "") + p
                for i, (p, d) in enumerate(zip(parts, dropped))
            )
    alone = "…" + sep.join(parts[n - leaf :])
    return alone if cells(alone) <= width and cells(alone) < total else None


def short_op(op: str | None) -> str | None:
    """``aten.mm.default`` → ``aten.mm`` (the overload adds nothing to a verdict)."""
    if not op:
        return op
    return op[: -len(".default")] if op.endswith(".default") else op


def fitted(
    parts: list[tuple[str, bool]], width: int = VERDICT_WIDTH, names: dict[int, str] | None = None
) -> str:
    """Join ``parts`` (text, optional) into one line of at most ``width`` cells: optional parts
    are dropped from the end, then the parts listed in ``names`` (index → the full name they
    hold, as ``{}`` in their text) are shortened in the middle, then the line is cut."""
    names = names or {}
    keep = list(parts)

    def text(widths: dict[int, int]) -> str:
        out = []
        for i, (p, _) in enumerate(keep):
            out.append(
                p.replace("{}", cut_middle(names[i], widths[i]) if i in names else "{}") if i in names else p
            )
        return "".join(out)

    full = {i: cells(n) for i, n in names.items()}
    while cells(text(full)) > width and any(opt for _, opt in keep):
        j = max(i for i, (_, opt) in enumerate(keep) if opt)
        keep[j] = ("", False)
    line = text(full)
    over = cells(line) - width
    if over > 0 and names:
        widths = dict(full)
        for i in sorted(names, key=lambda i: -full[i]):  # the longest name gives first
            give = min(over, max(0, widths[i] - 10))
            widths[i] -= give
            over -= give
        line = text(widths)
    return cut_end(line, width)


def verdict(rep: Report, width: int = VERDICT_WIDTH) -> Verdict:
    """The one-line answer, at most ``width`` cells (it never wraps at 80 columns): what was
    found, where, and the cause code right after the mark so a grep finds it."""
    if rep.check is not None:
        return check_verdict([rep], width)
    if rep.bisect is not None:
        return _bisect_verdict(rep.bisect, width)
    if rep.exit_code() == 0 and rep.diagnosis is None:  # any diagnosis is a fault, whatever its code
        msg = "✔ no NaN/Inf found" + (" in the weights (weights-only scan)" if rep.run is None else "")
        caveats = [(c, False) for c in caveat_parts(rep)]
        if rep.near_misses:
            caveats.append((f" · {len(rep.near_misses)} near miss(es)", False))
        return Verdict(fitted([(msg, False), *caveats], width), "warn" if caveats else "ok")
    return Verdict(_fault_line(rep, width), "bad")


def _fault_line(rep: Report, width: int) -> str:
    """A failing scan: "✘ CAUSE: what, where" for any cause code (unknown codes read generically)."""
    f, d = rep.first_nonfinite, rep.diagnosis
    cause = d.cause if d is not None else None
    head = f"✘ {cause}: " if cause else "✘ "
    if (
        cause == "compile_divergence"
    ):  # eager is finite: the fault (NaN, or a divergence) is the compiled run's
        where = module_name(d.module) if d is not None else "?"
        compiled_bad = rep.compile is not None and not rep.compile.get("compiled_finite", True)
        how = ", non-finite" if compiled_bad else ", outputs differ"
        return fitted(
            [(head + "torch.compile parts from eager at {}", False), (how, True)], width, {0: where}
        )
    if f is not None:
        kind = KIND_WORD.get(f.kind, f.kind)
        where = module_name(f.module)
        op = short_op(f.op)
        if cause == "not_reproducible":
            return fitted(
                [
                    (head + f"{kind} at " + "{}", False),
                    (" did not reproduce on re-run", False),
                    (": hardware fault or non-determinism?", True),
                ],
                width,
                {0: where},
            )
        if f.role == "input" and f.phase != "backward":
            return fitted(
                [
                    (head + f"{kind} in the input data, first reaching " + "{}", False),
                    (f" ({which_input(rep)})", True),
                ],
                width,
                {0: where},
            )
        if f.role == "input":
            return fitted(
                [(head + f"{kind} gradient from the loss, first reaching " + "{}", False)], width, {0: where}
            )
        if f.role == "weights":
            name = f.param or where
            return fitted(
                [(head + f"{kind} in the weights of " + "{}", False), (f" at {op}" if op else "", True)],
                width,
                {0: name},
            )
        phase = training_phrase(f)
        if f.phase == "optimizer":
            return fitted(
                [(head + f"{kind} in optimizer.step() of " + "{}", False)], width, {0: f.param or where}
            )
        # a training fault's phase is kept before the op: it says where to look (backward, optimizer)
        parts = [
            (head + f"{kind} first produced by " + "{}", False),
            (f" at {op}" if op else "", True),
            (phase, not phase),
        ]
        dt = rep.run_fact("dtype")
        if dt:
            parts.append((f" ({dt})", True))
        return fitted(parts, width, {0: where})
    w = rep.weights or {}
    bad = w.get("nonfinite") or []
    if cause == "bad_scale" and d is not None and d.param:  # the weights verdict names the quantized weight
        return fitted([(head + "bad scale in {}", False), (f": {d.summary}", True)], width, {0: d.param})
    if bad:
        first = next((b for b in bad if d is None or not d.param or b["name"] == d.param), bad[0])
        more = f" (+{len(bad) - 1} more tensor(s))" if len(bad) > 1 else ""
        return fitted([(head + "NaN/Inf in {}", False), (more, True)], width, {0: first["name"]})
    if d is not None:
        subject = d.module if d.module else None
        if subject:
            return fitted([(head + "{}", False), (f": {d.summary}", True)], width, {0: subject})
        return fitted([(head + d.summary, False)], width)
    return fitted([("✘ a non-finite value was found", False)], width)


def _bisect_verdict(b: BisectResult, width: int) -> Verdict:
    if b.over == "inputs" and b.failing_inputs is not None:
        if not b.failing_inputs:
            return Verdict(
                fitted([(f"✔ every input is finite in {b.dtype} ({b.runs} runs)", False)], width), "ok"
            )
        return Verdict(
            cut_end(
                f"✔ {len(b.failing_inputs)} input(s) fail in {b.dtype}: "
                + ", ".join(f"#{i}" for i in b.failing_inputs),
                width,
            ),
            "warn",
        )
    if b.already_finite:
        return Verdict(
            cut_end(f"✔ the run in {b.dtype} is already finite: nothing to keep in {b.keep_dtype}", width),
            "ok",
        )
    if b.finite_after:
        err = f", max rel err {fmt(b.max_rel_err)}" if b.max_rel_err is not None else ""
        return Verdict(
            fitted(
                [
                    (
                        f"✔ keep {len(b.keep_modules)} module(s) in {b.keep_dtype}: the {b.dtype} run is "
                        "finite",
                        False,
                    ),
                    (err, True),
                    (f" ({b.runs} runs)", True),
                ],
                width,
            ),
            "ok",
        )
    return Verdict(
        cut_end(f"✘ no module set fixes it: non-finite even with every candidate in {b.keep_dtype}", width),
        "bad",
    )


def caveat_parts(rep: Report) -> list[str]:
    """[" · 3 tensors not checked", " · 1 suspicious"]: what a clean weights verdict must not hide."""
    w = rep.weights or {}
    out = []
    n = len(w.get("unchecked") or [])
    if n:
        out.append(f" · {n} tensor{'s' if n != 1 else ''} not checked")
    m = len(w.get("suspicious") or [])
    if m:
        out.append(f" · {m} suspicious")
    return out


def training_phrase(f: Any) -> str:
    """ " in the backward (SqrtBackward0)" / " in optimizer.step() of lm_head.weight" ("" for a forward)."""
    phase = getattr(f, "phase", "forward")
    if phase == "backward":
        return f" in the backward ({f.grad_fn})" if f.grad_fn else " in the backward"
    if phase == "optimizer":
        return f" in optimizer.step() of {f.param}" if f.param else " in optimizer.step()"
    return ""


def bisect_lines(rep: Report) -> list[tuple[str, str]]:
    """What bisect found, as (label, text): the modules to keep and a ready line for transformers'
    ``_keep_in_fp32_modules``; for ``--over inputs``, the failing inputs and shortest prefixes."""
    b = rep.bisect
    if b is None:
        return []
    labels = rep.run_fact("inputs") or []
    if b.over == "inputs":
        prefix = b.shortest_failing_prefix or {}
        return [
            (
                "failing",
                f"#{i} {labels[i] if i < len(labels) else ''}".rstrip()
                + (f" · shortest failing prefix {prefix[str(i)]} tokens" if str(i) in prefix else ""),
            )
            for i in (b.failing_inputs or [])
        ]
    out = [("keep", f"{m} → {b.keep_dtype}") for m in b.keep_modules]
    if b.keep_in_fp32_modules:
        # one name a line: a bracketed list is one word to the wrapper, shortened mid-name at 80 columns
        names = b.keep_in_fp32_modules
        if len(names) == 1:
            out.append(("transformers", f'_keep_in_fp32_modules = ["{names[0]}"]'))
        else:
            out.append(("transformers", "_keep_in_fp32_modules = ["))
            out += [("", f'    "{m}",') for m in names]
            out.append(("", "]"))
    return out


# --- what was scanned, where it broke, why ----------------------------------------------------


def title(reps: list[Report]) -> str:
    mode = "check" if any(r.check is not None for r in reps) else reps[0].mode if reps else "scan"
    name = (reps[0].checkpoint or {}).get("path") if len(reps) == 1 else f"{len(reps)} checkpoints"
    return f"nanhunter {mode} — {name}"


def meta_rows(rep: Report) -> list[tuple[str, str]]:
    ck = rep.checkpoint or {}
    rows = [
        ("checkpoint", str(ck.get("path"))),
        (
            "format",
            f"{ck.get('format')} · {ck.get('n_tensors')} tensors · {size(ck.get('bytes') or 0)}"
            if ck.get("n_tensors") is not None
            else str(ck.get("format")),
        ),
    ]
    if rep.run:
        r = rep.run
        # a watch counts forwards (its steps), a scan the inputs of its data set
        unit = "step" if rep.mode == "watch" else "input"
        failing = f" · failing {unit}s {r['failed_inputs']}" if r.get("failed_inputs") else ""
        amp = r.get("autocast")
        under = f" (torch.autocast {amp['device_type']})" if amp else ""
        n = r["n_inputs"]
        count = f"{n} forward(s)" if rep.mode == "watch" else f"{n} input(s)"
        rows.append(("run", f"{r['dtype']}{under} on {r['device']} · {count}{failing}"))
        skipped = r.get("skipped_steps")
        if skipped:
            rows.append(
                (
                    "skipped",
                    f"step(s) {', '.join(map(str, skipped))}: non-finite, their updates undone "
                    f"(on_fault={r.get('on_fault')!r})",
                )
            )
        g = r.get("generate")
        if g:
            bad = (
                f", first non-finite at step {g['first_bad_step']}"
                if g.get("first_bad_step") is not None
                else ""
            )
            rows.append(
                ("decoding", f"greedy, up to {g['max_new_tokens']} new tokens · {g['steps']} step(s){bad}")
            )
    else:
        rows.append(("run", "none (weights-only)"))
    cap = ck.get("capsule")
    if cap:
        rows.append(
            (
                "capsule",
                f"step {cap.get('step')} · {cap.get('phase')} fault · model from "
                f"{cap.get('built_from') or '?'}",
            )
        )
    if rep.check is not None:
        rows.append(("dtypes checked", ", ".join(rep.check.get("dtypes") or [])))
    return rows


def where_rows(rep: Report) -> list[tuple[str, str]]:
    """The first non-finite value: module, op, value, and the tensor and source line when known."""
    f = rep.first_nonfinite
    if f is None:
        return []
    rows = [
        ("module", f"{module_name(f.module)} ({f.module_type}, call {f.call_index})"),
        ("op", f.op or "—"),
        ("value", f"{f.kind} · role {f.role} · {which_input(rep)}"),
    ]
    when = when_row(rep)
    if when:
        rows.append(("when", when))
    if f.phase != "forward" and rep.mode != "watch":  # a watch names step and phase in the value row
        rows.append(("phase", f"{f.phase} · step {f.step}"))
    if f.grad_fn:
        rows.append(("autograd node", f.grad_fn))
    if f.param:
        rows.append(("parameter", f.param))
    if f.tensor:
        rows.append(("tensor", f.tensor))
    if f.source:
        path, line, code = split_source(f.source)
        rows.append(("source", f"{path}:{line}" if line is not None else str(path)))
        if code:
            rows.append(("code", code))
    return rows


def which_input(rep: Report) -> str:
    """Where the first non-finite value was met: "input #2" of a scan's data set, "step 3 ·
    forward" of a watched (training) run, whose forwards are its steps."""
    f = rep.first_nonfinite
    assert f is not None  # asked only of a report with a first non-finite value
    if rep.mode == "watch":
        return f"step {f.step} · {f.phase}"
    return f"input #{f.input_index}"


def when_row(rep: Report) -> str | None:
    """Under --generate: "step 3, token 9 '6' at position 7, after: '4 5 6'"."""
    f, g = rep.first_nonfinite, rep.run_fact("generate")
    if f is None or not g:
        return None
    parts = [f"step {f.step}" + (" (the prompt's forward)" if f.step == 0 else "")]
    tok = g.get("fault_token")
    if tok:
        parts.append(
            f"token {tok['id']} {tok['text']!r}" if tok.get("text") is not None else f"token {tok['id']}"
        )
    if f.position is not None:
        parts.append(f"at position {f.position}")
    text = g.get("text_before_fault")
    return ", ".join(parts) + (f", after: {text!r}" if text else "")


GENERATE_HEAD = ["input", "label", "result", "shortest failing prefix"]


def generate_rows(rep: Report) -> list[list[str]]:
    """Prompt sensitivity under --generate with several inputs: which fail, at which step."""
    g = rep.run_fact("generate") or {}
    per = g.get("per_input") or []
    if len(per) < 2:
        return []
    labels = rep.run_fact("inputs") or []
    prefix = g.get("shortest_failing_prefix") or {}
    out = []
    for r in per:
        i = r["index"]
        res = f"fails at step {r['step']}" if r["failed"] else f"finite for {r['steps']} steps"
        pre = prefix.get(str(i))
        out.append([f"#{i}", labels[i] if i < len(labels) else "", res, f"{pre} tokens" if pre else "—"])
    return out


def producer_index(rep: Report) -> int | None:
    """Row of ``rep.modules`` holding the first producer (module + input + call)."""
    f = rep.first_nonfinite
    if f is None:
        return None
    return next(
        (
            i
            for i, m in enumerate(rep.modules or [])
            if m["module"] == f.module
            and m["input_index"] == f.input_index
            and m["call_index"] == f.call_index
            and m.get("phase", "forward") == f.phase
            and m.get("param") == (f.param if f.phase == "optimizer" else None)
        ),
        None,
    )


def call_name(row: Row) -> str:
    """A module call row's name: ``∇ name`` for its backward, ``step param`` for an optimizer step."""
    phase = row.get("phase")
    if phase == "backward":
        return f"∇ {module_name(row['module'])}"
    if phase == "optimizer":
        return f"step {row.get('param') or module_name(row['module'])}"
    return module_name(row["module"])


LEAD_HEAD = ["module", "type", "in absmax", "out absmax", "NaN", "+inf", "−inf"]


def lead_rows(rep: Report, n: int = LEAD_CALLS) -> tuple[list[list[str]], int | None]:
    """The ``n`` calls before the producer and the producer itself (execution order, columns
    ``LEAD_HEAD``), and the producer's position among them."""
    p = producer_index(rep)
    if p is None:
        return [], None
    lo = max(0, p - n)
    # A call whose outputs are all non-finite has no finite absmax (0 in the report): show —.
    rows = [
        [
            call_name(m),
            m["module_type"],
            fmt(m["in_absmax"]),
            "—" if is_bad(m) and not m["absmax"] else fmt(m["absmax"]),
            fmt(m["nan"]),
            fmt(m["posinf"]),
            fmt(m["neginf"]),
        ]
        for m in (rep.modules or [])[lo : p + 1]
    ]
    return rows, p - lo


@dataclass(frozen=True)
class DiagnosisView:
    cause: str
    summary: str
    where: tuple[str, str, str] | None  # module, op, dtype
    evidence: list[str]
    fix: str
    check: str  # what re-running the fix on a copy showed (or why there is nothing to re-run)
    check_tone: str  # ok | bad | none
    #: contract v1.4 ``alternatives``, each with what its own re-run showed (never merged into ``fix``)
    alternatives: tuple[str, ...] = ()


VERIFIED = " Verified: "  # how explain/fix_check.with_verdict appends the verified sentence to the fix


def fix_check_line(rep: Report) -> tuple[str, str]:
    """The verified fix as one line and its tone: ok (finite), bad (still non-finite), none."""
    d = rep.diagnosis
    if d is None:
        return "", "none"
    fv = d.fix_verified
    if fv is None:
        why = no_mechanical_fix(d.cause)
        if why:
            return f"no mechanical fix to verify: {why}", "none"
        return UNVERIFIED.get(d.fix_unverified or "", "not verified (nothing was re-run)"), "none"
    where = "the whole model" if fv.scope == "model" else "the failing module"
    if fv.finite:
        err = (
            f", max rel err {fmt(fv.max_rel_err)} vs {fv.reference}"
            if fv.max_rel_err is not None
            else f" (the {fv.reference} run is not finite to compare with)"
        )
        if fv.scope != "model":  # contract v1.4: "verified" means the whole model's outputs were judged
            return (
                f"checked on a copy of {where} only, not the whole model: {fv.change} → finite{err}",
                "none",
            )
        return f"✔ verified on a copy of {where}: {fv.change} → finite{err}", "ok"
    if fv.scope == "model" and fv.max_rel_err is not None:  # finite, but too far from the reference
        return (
            f"✘ tried on a copy of {where}: {fv.change} → finite, but max rel err {fmt(fv.max_rel_err)} vs "
            f"{fv.reference}, past the tolerance: not a fix"
        ), "bad"
    at = f" at {module_name(d.module)}" if fv.scope == "model" and d.module is not None else ""
    return f"✘ tried on a copy of {where}: {fv.change} → still non-finite{at}", "bad"


def diagnosis(rep: Report) -> DiagnosisView | None:
    d = rep.diagnosis
    if d is None:
        return None
    where = (module_name(d.module), d.op or "", str(d.dtype)) if d.module is not None or d.op else None
    check, tone = fix_check_line(rep)
    return DiagnosisView(
        d.cause,
        d.summary,
        where,
        list(d.evidence),
        d.fix.split(VERIFIED)[0],
        check,
        tone,
        tuple(alternative_line(a) for a in d.alternatives or []),
    )


def alternative_line(a: dict) -> str:
    """One of ``diagnosis.alternatives``: its text and what its own re-run showed."""
    fv = a.get("fix_verified")
    if isinstance(fv, dict):
        finite, scope = fv.get("finite"), fv.get("scope")
    else:
        finite, scope = getattr(fv, "finite", None), getattr(fv, "scope", None)
    if fv is None:
        tag = "(not verified)"
    elif finite and scope == "model":
        tag = "(✔ also verified on the whole model)"
    elif finite:
        tag = "(checked on the failing module only)"
    else:
        err = fv.get("max_rel_err") if isinstance(fv, dict) else getattr(fv, "max_rel_err", None)
        tag = (
            f"(✘ tried: finite, but max rel err {fmt(err)} vs fp32, past the tolerance)"
            if err is not None
            else "(✘ tried: still non-finite)"
        )
    return f"{a.get('fix')} {tag}"


REPLAY_HEAD = ["dtype", "finite", "NaN", "+inf", "−inf", "absmax", "rel err vs fp64"]


def replay_rows(rep: Report) -> list[list[str]]:
    """The failing region re-run per dtype (the fp64 reference itself left out)."""
    return [
        [
            d,
            "yes" if r["finite"] else "NO",
            fmt(r["nan"]),
            fmt(r["posinf"]),
            fmt(r["neginf"]),
            fmt(r["absmax"]),
            fmt(r["rel_err"]),
        ]
        for d, r in (rep.replay or {}).items()
        if d != "fp64"
    ]


def range_dtype(run_dtype: str) -> str:
    """The dtype activations of a run in ``run_dtype`` are stored in, whose max bounds them (the
    one dtype rule, ``dtypes.RunDtype``: fp8 runs compute and store in bf16 around fp8 operands)."""

    return RunDtype.of(run_dtype).compute


def range_max(run_dtype: str) -> float:

    return RunDtype.of(run_dtype).range.max


MATRIX_HEAD = ["dtype", "finite", "failing inputs", "first non-finite", "cause", "largest output", "of max"]


def matrix_rows(rep: Report) -> list[list[str]]:
    """``check``: one row per forward dtype (finite? where it broke, how close it came to the max)."""
    rows = []
    for d, r in ((rep.check or {}).get("runs") or {}).items():
        f = r.get("first_nonfinite")
        where = f"{module_name(f['module'])} @ {f['op'] or '?'} ({f['kind']})" if f else "—"
        big = (
            f"{fmt(r['absmax'])} at {module_name(r['absmax_module'])}" if r.get("absmax") is not None else "—"
        )
        share = r["absmax"] / range_max(d) if r.get("absmax") is not None else None
        frac = "—" if share is None else share_of_max(share)
        rows.append(
            [
                d,
                "yes" if r["finite"] else "NO",
                fmt(r["failed_inputs"] or "—"),
                where,
                r.get("cause") or "—",
                big,
                frac,
            ]
        )
    return rows


CHECK_HEAD = ["status", "rule", "result"]


def check_rows(rep: Report) -> list[list[str]]:
    return [[r["status"], r["rule"], r["message"]] for r in results(rep)]


# --- weights, near misses, notes --------------------------------------------------------------

WEIGHTS_HEAD = ["tensor", "dtype", "shape", "NaN", "+inf", "−inf", "first bad index", "absmax / headroom"]


@dataclass(frozen=True)
class WeightsRows:
    rows: list[list[str]]
    bad: list[bool]  # per row: non-finite (else near overflow)
    hidden: int  # rows left out by max_rows


def weights_rows(
    rep: Report, max_rows: int = WEIGHTS_MAX_ROWS, targets: Sequence[str] = WEIGHTS_TARGETS
) -> WeightsRows:
    """Non-finite tensors, then those near the max of a target dtype (``weights.targets``): at
    most ``max_rows`` rows (``weights.max_rows``)."""
    w = rep.weights or {}
    rows = [
        [
            b["name"],
            b["dtype"],
            str(b["shape"]),
            fmt(b["nan"]),
            fmt(b["posinf"]),
            fmt(b["neginf"]),
            str(b["first_index"]),
            "",
        ]
        for b in w.get("nonfinite") or []
    ]
    n_bad = len(rows)
    for n in w.get("near_overflow") or []:
        tight = [(d, h) for d, h in n["headroom"].items() if d in targets]
        if not tight:
            continue
        room = ", ".join(f"{d} {'OVERFLOWS' if d in n['overflows'] else f'{h:.2g}x'}" for d, h in tight)
        rows.append([n["name"], n["dtype"], "", "0", "0", "0", "", f"{fmt(n['absmax'])} · {room}"])
    kept = rows[: max(0, max_rows)]
    return WeightsRows(kept, [i < n_bad for i in range(len(kept))], len(rows) - len(kept))


def near_miss_lines(rep: Report, max_listed: int | None = None) -> tuple[list[str], int]:
    """Near-miss messages, at most ``max_listed`` (``near_miss.max_listed``), and how many more."""
    msgs = [nm["message"] for nm in rep.near_misses]
    if max_listed is None:
        return msgs, 0
    return msgs[: max(0, max_listed)], max(0, len(msgs) - max(0, max_listed))


QUANT_HEAD = ["quantized weight", "format", "scale tensor", "block", "scale", "problem"]
CAVEAT_HEAD = ["tensor", "finding"]


def quantized_rows(rep: Report, max_rows: int = WEIGHTS_MAX_ROWS) -> tuple[list[list[str]], int]:
    """Bad blocks of quantized weights (``weights.quantized``), one row per block, and how many were
    left out past ``max_rows``; then quantized weights whose dequantized values overflow fp16."""
    rows: list[list[str]] = []
    total = 0
    for q in (rep.weights or {}).get("quantized") or []:
        for b in q["bad_blocks"]:
            total += 1
            if len(rows) < max_rows:
                where = str(b.get("tensor") or q["scale"]) + (f" ({b['field']})" if b.get("field") else "")
                rows.append(
                    [
                        str(q["name"]),
                        str(q["format"]),
                        where,
                        str(b["index"]),
                        str(b["scale"]),
                        _problem_words(b),
                    ]
                )
        if q["overflows"].get("fp16") and len(rows) < max_rows:
            total += 1
            rows.append(
                [
                    str(q["name"]),
                    str(q["format"]),
                    str(q["scale"]),
                    "all",
                    f"dequantized absmax {fmt(q['dequant_absmax'])}",
                    "overflows fp16",
                ]
            )
    return rows, total - len(rows)


def _problem_words(b: dict) -> str:
    """A bad block's problem; a zero point of the wrong convention says which was found and declared."""
    if b.get("problem") != "zero_point":
        return str(b["problem"])
    found = b.get("found")
    how = f"stored as {found}" if found else "neither convention"
    return (
        f"zero point {b.get('zero_point')} ({how}, declared {b.get('declared')}; "
        f"{b.get('n_groups', '?')} groups)"
    )


def caveat_rows(rep: Report) -> list[list[str]]:
    """Suspicious tensors and tensors not checked, as (tensor, finding)."""
    w = rep.weights or {}
    out = [
        [
            str(s["name"]),
            "all zero (a failed load?)"
            if s["reason"] == "all_zero"
            else f"|x| {fmt(s['absmax'])} (uninitialised memory?)",
        ]
        for s in w.get("suspicious") or []
    ]
    out += [[str(u["name"]), f"not checked: {u['reason']}"] for u in w.get("unchecked") or []]
    return out


# --- reproducing: command, versions, inputs, every tensor -----------------------------------------


def versions() -> list[tuple[str, str]]:
    """(package, version) of nanhunter, torch and transformers as installed (not imported)."""
    from importlib import metadata

    out = [("nanhunter", __version__)]
    for pkg in ("torch", "transformers"):
        try:
            out.append((pkg, metadata.version(pkg)))
        except metadata.PackageNotFoundError:
            out.append((pkg, "not installed"))
    return out


def command_line(rep: Report) -> str | None:
    """``run.command`` as a shell line (each argument quoted where needed)."""
    import shlex

    cmd = rep.run_fact("command")
    return " ".join(shlex.quote(str(a)) for a in cmd) if cmd else None


INPUTS_HEAD = ["input", "label", "finite", "text"]


def input_rows(rep: Report) -> list[list[str]]:
    """Per input of the data set: index, label, finite, its text (prompt or data line)."""
    return [
        [
            f"#{r.get('index')}",
            str(r.get("label") or ""),
            "yes" if r.get("finite") else "NO",
            r.get("text") or "—",
        ]
        for r in rep.inputs or []
    ]


TENSORS_HEAD = ["tensor", "dtype", "shape", "absmax", "abs-min ≠ 0", "fp16 max / absmax", "→ 0 in fp16"]


def tensor_rows(rep: Report, max_rows: int = 200) -> tuple[list[list[str]], int]:
    """Every scanned tensor (at most ``max_rows``): range, smallest non-zero magnitude, fp16
    headroom and the fraction of non-zero values that flush to zero in fp16; and how many more."""
    ts = (rep.weights or {}).get("tensors") or []
    rows = []
    for t in ts[: max(0, max_rows)]:
        room = (t.get("headroom") or {}).get("fp16")
        zero = t.get("fp16_zero_frac")
        rows.append(
            [
                t["name"],
                t["dtype"],
                str(t["shape"]),
                fmt(t.get("absmax")),
                fmt(t.get("min_nonzero")),
                f"{room:.3g}x" if isinstance(room, float) else "—",
                "—" if zero is None else f"{zero:.2%}",
            ]
        )
    return rows, max(0, len(ts) - len(rows))


def forecast_lines(rep: Report, max_listed: int) -> tuple[list[str], int]:
    """The overflow forecast's first ``max_listed`` entries (``forecast.max_listed``) as lines, and how
    many more: soonest projected crossing first (the report's order)."""
    entries = getattr(rep, "forecast", None) or []
    lines = []
    for e in entries[: max(0, max_listed)]:
        head = e["headroom_db"]
        past = head <= 0
        where = (
            f"{-head:.1f} dB past the {e['dtype']} max"
            if past
            else f"{head:.1f} dB below the {e['dtype']} max"
        )
        when = (
            "already past it"
            if past
            else f"crosses at step {e['projected_step']}"
            if e["projected_step"] is not None
            else "no projection (too noisy, or too far ahead)"
        )
        lines.append(
            f"{e['module'] or '(root)'} {e['signal']}: {where}, "
            f"{e['rate_db_per_100_steps']:+.1f} dB/100 steps, {when} ({e['confidence']} confidence)"
        )
    return lines, max(0, len(entries) - max(0, max_listed))


def warning_lines(rep: Report) -> list[str]:
    """The precursor warnings (never faults): code, step, module, evidence, fix."""
    out = []
    for w in getattr(rep, "warnings", None) or []:
        where = f" in {w['module']}" if w.get("module") else ""
        out.append(f"{w['code']} at step {w['step']}{where}: {'; '.join(w['evidence'])} — fix: {w['fix']}")
    return out
