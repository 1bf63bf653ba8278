"""JUnit XML of a report view: one test case per check and host, for CI report parsers.

``testsuites > testsuite(name, tests, failures, errors, skipped, time) > testcase(classname, name,
time) > failure | error | skipped``. ``classname`` carries the run kind and the host (GitLab shows
it as the suite and keeps only the first case of a classname + name pair, so each pair is unique).
A failed check is a ``failure``, evidence that could not be read is an ``error`` (never a pass),
an unreachable host's checks or a probe that did not run are ``skipped`` (docs/decision.md).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from k3fleet.report.escapes import safe_text
from k3fleet.report.view import CheckRow, ReportView

_MAX_TEXT = 4000


def _clean(text: str) -> str:
    # XML 1.0 forbids most control characters; node output can carry them. Redacted before the
    # cut, so a cut cannot keep the start of a secret.
    return safe_text(text, one_line=False)[:_MAX_TEXT]


def render_junit(view: ReportView) -> str:
    root = ET.Element("testsuites", name=f"k3fleet {view.kind} {view.run}")
    groups: dict[str, list[CheckRow]] = {}
    for row in view.checks:
        groups.setdefault(row.group, []).append(row)
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for group, rows in groups.items():
        suite = ET.SubElement(root, "testsuite", name=_clean(f"{view.kind}.{group}"))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        seen: set[str] = set()
        for row in rows:
            name = row.check
            n = 2
            while name in seen:
                name = f"{row.check} #{n}"
                n += 1
            seen.add(name)
            case = ET.SubElement(suite, "testcase", classname=_clean(f"k3fleet.{view.kind}.{group}"),
                                 name=_clean(name), time="0")
            counts["tests"] += 1
            message = _clean(row.message or row.check)
            if row.status == "fail":
                el = ET.SubElement(case, "failure", message=message, type=row.severity or "fail")
                counts["failures"] += 1
            elif row.status == "error":
                el = ET.SubElement(case, "error", message=message, type="evidence_missing")
                counts["errors"] += 1
            elif row.status == "skipped":
                el = ET.SubElement(case, "skipped", message=message)
                counts["skipped"] += 1
            else:
                el = None
            if el is not None and row.evidence:
                el.text = _clean(f"evidence: {row.evidence}")
            elif row.status in ("pass", "warn") and row.message:
                ET.SubElement(case, "system-out").text = message
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
        suite.set("time", "0")
    for k in ("tests", "failures", "errors"):
        root.set(k, str(totals[k]))
    root.set("time", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
