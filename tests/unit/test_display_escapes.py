"""Text from outside (nodes, servers, the operator) is shown as plain text everywhere it is shown
(docs/safety.md "Display"): the consoles every command prints through, the Markdown reports and the
HTML page. Rich markup, ESC sequences and bidi overrides in a value print as text, never as styles or
control codes, and never crash the printout; secrets are redacted on the way."""

from __future__ import annotations

import io
import json

import pytest
from rich.table import Table
from rich.text import Text

from k3fleet.cli.base import SafeConsole
from k3fleet.report.decision_md import render_markdown
from k3fleet.report.escapes import safe_html, safe_json, safe_markdown, safe_markup, safe_rich_text, safe_text
from k3fleet.report.html import render_html
from k3fleet.report.markdown import render_plan
from k3fleet.report.view import CheckRow, HostRow, ReportView

SECRET = "Zq9displaySecret"
# What an attacker puts in a reviewer name, a --host, a server message or a model id.
HOSTILE = f"eve[/bold][red]x[/red]\x1b[31m\x1b]0;title\x07\u202eevil | <script>`[a](b)` api key: {SECRET}"
RAW = ("\x1b", "\x07", "\u202e", SECRET)


def _console() -> tuple[SafeConsole, io.StringIO]:
    buf = io.StringIO()
    return SafeConsole(file=buf, width=300, highlight=False, soft_wrap=True, force_terminal=False), buf


def _clean(text: str) -> None:
    for raw in RAW:
        assert raw not in text, (raw, text)


def test_safe_text_and_markup() -> None:
    _clean(safe_text(HOSTILE))
    assert "[/bold]" in safe_text(HOSTILE)
    assert safe_markup("[/bold] a") == "\\[/bold] a"
    assert safe_markup(f"token={SECRET}") == "token=***"


@pytest.mark.parametrize("line", [
    # A CSI whose intermediate is the space before the key and whose final byte is the key's first letter:
    # stripped first, "token=" would become "oken=" and the value would pass (found by the property test).
    f"\x1b[ token={SECRET} ",
    f"\x1b[1; token={SECRET}",
    # An escape inside the key: only the text without it reads as a key.
    f"to\x1b[31mken={SECRET}",
])
def test_an_escape_cannot_hide_a_secret_from_the_redactor(line: str) -> None:
    for shown in (safe_text(line), safe_markdown(line, cell=True), safe_html(line)):
        assert SECRET not in shown, shown


def test_a_markup_string_that_does_not_parse_prints_as_text() -> None:
    console, buf = _console()
    console.print(f"[bold]probe[/bold]: {HOSTILE}")  # an unescaped value: the printout survives it
    console.print(f"[bold]probe[/bold]: {safe_markup(HOSTILE)}")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    _clean(buf.getvalue())
    assert "[/bold][red]x[/red]" in lines[1] and lines[1].startswith("probe: eve")


def test_tables_titles_and_text_objects_pass_the_chokepoint() -> None:
    console, buf = _console()
    table = Table(title=f"triage: {HOSTILE}")
    table.add_column("message")
    table.add_row(HOSTILE)
    table.add_row(Text(f"Authorization: Bearer {SECRET}", style="red"))
    console.print(table)
    console.print(Text("host ").append(HOSTILE, style="bold"))
    _clean(buf.getvalue())
    assert "Authorization: ***" in buf.getvalue()


def test_styles_survive_when_pieces_are_clean_on_their_own() -> None:
    text = Text("ok ").append("\x1b[2Jbad", style="red").append(f" token={SECRET}", style="bold")
    out = safe_rich_text(text)
    assert out.plain == "ok bad token=***"
    assert [(out.plain[s.start:s.end], str(s.style)) for s in out.spans] == [("bad", "red"), (" token=***", "bold")]
    # A secret split across styles is still found: the whole is cleaned, the styles go.
    split = Text("api ").append("key: ", style="red").append(SECRET, style="bold")
    assert safe_rich_text(split).plain == "api key: ***"


def test_print_json_is_redacted_structurally_and_prints_values_escaped() -> None:
    console, buf = _console()
    data = {"reviewer": HOSTILE, "api_key": SECRET, "passed": 3, "argv": ["vllm", "--api-key", SECRET]}
    console.print_json(json.dumps(data))
    _clean(buf.getvalue())
    back = json.loads(buf.getvalue())
    assert back["api_key"] == "***" and back["passed"] == 3 and back["argv"] == ["vllm", "--api-key", "***"]
    # The name is printed as given, only escaped (JSON keeps it; the terminal never sees the raw codes).
    assert back["reviewer"] == HOSTILE.replace(SECRET, "***")
    assert safe_json({"token": SECRET}) == {"token": "***"}


@pytest.mark.parametrize("cell", [True, False])
def test_markdown_escapes_markup_and_pipes(cell: bool) -> None:
    md = safe_markdown(HOSTILE, cell=cell)
    _clean(md)
    assert "\\<script>" in md and "\\[a\\](b)" in md and "\\`" in md
    assert ("\\|" in md) is cell
    assert safe_markdown("a`b|c", cell=True, code=True) == "a'b\\|c"


def test_html_escapes_after_redaction() -> None:
    html = safe_html(HOSTILE)
    _clean(html)
    assert "&lt;script&gt;" in html and "<script>" not in html


def _view() -> ReportView:
    v = ReportView(kind="decision", run="r1", title=f"k3fleet decision: {HOSTILE}", outcome="go_live", approved=True,
                   exit_code=0)
    v.meta = [("reviewer", HOSTILE)]
    v.reasons = [{"rule": "chain.mismatch", "outcome": "rebuild_environment", "text": HOSTILE, "evidence": HOSTILE}]
    v.limits = [{"kind": "rate", "value": HOSTILE, "owner": HOSTILE, "text": HOSTILE}]
    v.checklist = [{"id": "signoff.reviewer", "title": "Reviewer", "status": "pass", "detail": HOSTILE,
                    "evidence": HOSTILE, "owner": HOSTILE}]
    v.hosts = [HostRow(host=HOSTILE, status="fail", driver=HOSTILE, gpus="8", findings=[HOSTILE])]
    v.checks = [CheckRow(HOSTILE, "driver.branch", "fail", HOSTILE)]
    v.baseline = {"image": HOSTILE}
    v.notes = [HOSTILE]
    return v


def test_decision_markdown_and_html_escape_every_value() -> None:
    md = render_markdown(_view())
    _clean(md)
    # HTML is escaped everywhere but in the baseline's code span, where Markdown shows it as text.
    assert md.count("<script>") == md.count("\\<script>") + 1
    assert "- image: `eve[/bold][red]x[/red]evil | <script>'[a](b)' api key: ***`" in md
    for line in md.splitlines():
        if line.startswith("| ") and "eve" in line:
            # Every row keeps its column count: no value adds a cell.
            assert line.replace("\\|", "").count("|") in (5, 6), line
    html = render_html(_view())
    _clean(html)
    assert "<script>" not in html.replace("<script>\n(function", "")


def test_audit_plan_markdown_escapes_host_names() -> None:
    plan = {"target_branch": "580", "target_version": "580.95.05",
            "needs_upgrade": [{"host": HOSTILE, "current_version": "575", "target_version": "580",
                               "packages": [{"name": "nvidia-driver-575", "to_name": "x", "to_version": "1"}]}]}
    lines = render_plan(plan)
    _clean("\n".join(lines))
    row = next(line for line in lines if "eve" in line)
    assert row.replace("\\|", "").count("|") == 5


def test_junit_and_prom_carry_no_control_code_or_secret() -> None:
    from k3fleet.report.junit import render_junit
    from k3fleet.report.prom import render_prom

    for text in (render_junit(_view()), render_prom(_view())):
        _clean(text)
        assert "eve" in text
