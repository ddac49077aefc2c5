"""CI views of ``nanhunter check`` results: JUnit XML, GitHub Actions annotations, and the terminal
summary. JUnit and annotations need only the standard library; rich is imported by the terminal
functions alone."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from ..report import Report

ICON = {"pass": "✔", "warn": "!", "fail": "✘"}
STYLE = {"pass": "green", "warn": "bold yellow", "fail": "bold red"}


def results(rep: Report) -> list[dict[str, Any]]:
    return (rep.check or {}).get("results") or []


def label(rep: Report) -> str:
    """The checkpoint as the user named it (rule results carry it), else its resolved path."""
    rs = results(rep)
    return rs[0]["checkpoint"] if rs else str((rep.checkpoint or {}).get("path"))


def counts(reps: list[Report]) -> dict[str, int]:
    c = {"pass": 0, "warn": 0, "fail": 0}
    for rep in reps:
        for r in results(rep):
            c[r["status"]] += 1
    return c


# --- JUnit XML ----------------------------------------------------------------------------------


def junit_xml(reps: list[Report]) -> str:
    """One ``<testsuite>`` per checkpoint, one ``<testcase>`` per rule. fail → ``<failure>``;
    warn → ``<skipped>`` (CI viewers show it yellow, not red) with the message in system-out."""
    total = counts(reps)
    root = ET.Element("testsuites", name="nanhunter check", tests=str(sum(total.values())),
                      failures=str(total["fail"]), errors="0", skipped=str(total["warn"]))
    for rep in reps:
        c = counts([rep])
        name = label(rep)
        suite = ET.SubElement(root, "testsuite", name=name, tests=str(sum(c.values())), failures=str(c["fail"]),
                              errors="0", skipped=str(c["warn"]))
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="dtypes", value=",".join((rep.check or {}).get("dtypes") or []))
        ET.SubElement(props, "property", name="forward", value="yes" if rep.run else "no (weights only)")
        for r in results(rep):
            case = ET.SubElement(suite, "testcase", name=r["rule"], classname=name, file=name)
            body = "\n".join([r["message"], *r.get("details", [])])
            if r["status"] == "fail":
                ET.SubElement(case, "failure", message=r["message"], type=r["rule"]).text = body
            elif r["status"] == "warn":
                ET.SubElement(case, "skipped", message=f"warning: {r['message']}")
            ET.SubElement(case, "system-out").text = f"{r['status'].upper()}: {body}"
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(reps: list[Report], path: str) -> None:
    from pathlib import Path

    from ..errors import BadInput

    try:
        Path(path).write_text(junit_xml(reps), encoding="utf-8")
    except OSError as e:
        raise BadInput(f"--junit {path}: cannot write ({e.strerror})") from None


# --- GitHub Actions annotations -----------------------------------------------------------------


def _data(s: str) -> str:
    # Workflow-command escaping (actions/toolkit): the message may not hold raw % CR LF.
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(s: str) -> str:
    return _data(s).replace(":", "%3A").replace(",", "%2C")


def annotations(reps: list[Report]) -> list[str]:
    """``::error``/``::warning`` workflow commands for failing and warning rules (passes say nothing)."""
    out = []
    for rep in reps:
        for r in results(rep):
            if r["status"] == "pass":
                continue
            level = "error" if r["status"] == "fail" else "warning"
            out.append(f"::{level} file={_prop(r['checkpoint'])},title={_prop('nanhunter ' + r['rule'])}::"
                       f"{_data(r['message'])}")
    return out


# --- terminal -----------------------------------------------------------------------------------


def results_table(rep: Report):
    from rich.table import Table
    from rich.text import Text

    tab = Table(title="check", title_justify="left", show_edge=False, header_style="bold")
    tab.add_column("", no_wrap=True)
    tab.add_column("rule", no_wrap=True)
    tab.add_column("result", overflow="fold")
    for r in results(rep):
        st = r["status"]
        tab.add_row(Text(ICON[st], style=STYLE[st]), Text(r["rule"], style=STYLE[st] if st != "pass" else ""),
                    r["message"])
    return tab


def verdict_text(reps: list[Report]) -> str:
    c = counts(reps)
    bad = [label(r) for r in reps if not (r.check or {}).get("passed")]
    what = f"{len(reps)} checkpoint(s), {sum(c.values())} rules: {c['fail']} failed, {c['warn']} warning(s)"
    if bad:
        return f"✘ check failed: {what} (failing: {', '.join(bad)})"
    return f"✔ check passed: {what}"


def render_check(reps: list[Report], console=None, strip: bool | None = None, max_rows: int = 20) -> None:
    """Per checkpoint: the scan panels (weights, headroom strip, producer, diagnosis), its rule
    results and notes; then one verdict line for the whole check."""
    from rich.console import Console
    from rich.text import Text

    from .terminal import render_body

    c = console or Console()
    for rep in reps:
        show_strip = strip if strip is not None else not (rep.check or {}).get("passed", True)
        render_body(rep, c, max_rows, bool(show_strip))
        c.print(results_table(rep))
        c.print()
    ok = all((r.check or {}).get("passed") for r in reps)
    c.print(Text(verdict_text(reps), style="bold green" if ok else "bold red"))

