"""CI views of ``nanhunter check`` results: JUnit XML and GitHub Actions annotations (standard
library only). Every string from the results goes through its sink's escaping."""

# no ``from __future__ import annotations`` here: the module's function ``annotations`` would redefine it
import xml.etree.ElementTree as ET

from ..outputs import write_text
from ..report import Report
from . import escape
from .rows import check_label, counts, results


def render_junit(reps: list[Report]) -> str:
    """One ``<testsuite>`` per checkpoint, one ``<testcase>`` per rule. fail → ``<failure>``;
    warn → ``<skipped>`` (CI viewers show it yellow, not red) with the message in system-out."""
    x = escape.junit
    total = counts(reps)
    root = ET.Element(
        "testsuites",
        name="nanhunter check",
        tests=str(sum(total.values())),
        failures=str(total["fail"]),
        errors="0",
        skipped=str(total["warn"]),
    )
    for rep in reps:
        c = counts([rep])
        name = x(check_label(rep))
        suite = ET.SubElement(
            root,
            "testsuite",
            name=name,
            tests=str(sum(c.values())),
            failures=str(c["fail"]),
            errors="0",
            skipped=str(c["warn"]),
        )
        props = ET.SubElement(suite, "properties")
        ET.SubElement(
            props, "property", name="dtypes", value=x(",".join((rep.check or {}).get("dtypes") or []))
        )
        ET.SubElement(props, "property", name="forward", value="yes" if rep.run else "no (weights only)")
        for r in results(rep):
            rule, message = x(r["rule"]), x(r["message"])
            case = ET.SubElement(suite, "testcase", name=rule, classname=name, file=name)
            body = "\n".join([message, *(x(d) for d in r.get("details", []))])
            if r["status"] == "fail":
                ET.SubElement(case, "failure", message=message, type=rule).text = body
            elif r["status"] == "warn":
                ET.SubElement(case, "skipped", message=f"warning: {message}")
            ET.SubElement(case, "system-out").text = f"{r['status'].upper()}: {body}"
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(reps: list[Report], path: str) -> None:
    """``--junit PATH``: ``render_junit`` written atomically (``-``: stdout)."""

    write_text("--junit", path, render_junit(reps))


def annotations(reps: list[Report]) -> list[str]:
    """``::error``/``::warning`` workflow commands for failing and warning rules (passes say
    nothing), one line each."""
    out = []
    for rep in reps:
        for r in results(rep):
            if r["status"] == "pass":
                continue
            level = "error" if r["status"] == "fail" else "warning"
            out.append(
                f"::{level} file={escape.actions_property(r['checkpoint'])},"
                f"title={escape.actions_property('nanhunter ' + r['rule'])}::"
                f"{escape.actions_message(r['message'])}"
            )
    return out
