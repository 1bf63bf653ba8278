"""``k3fleet report``: one view, four formats. ``--out`` is written by the one writer
(``k3fleet.evidence.writer``): atomically, and its temporary name never ends in ``.prom``, so a
textfile collector never reads half a file."""

from __future__ import annotations

from k3fleet.errors import UsageError
from k3fleet.report.decision_md import render_markdown
from k3fleet.report.html import render_html
from k3fleet.report.junit import render_junit
from k3fleet.report.view import ReportView

FORMATS = ("md", "html", "junit", "prom")


def render(view: ReportView, fmt: str) -> str:
    if fmt == "md":
        return render_markdown(view)
    if fmt == "html":
        return render_html(view)
    if fmt == "junit":
        return render_junit(view)
    if fmt == "prom":
        # lazy: prometheus_client is heavy and only this format needs it
        from k3fleet.report.prom import render_prom

        return render_prom(view)
    raise UsageError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
