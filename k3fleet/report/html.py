"""A self-contained HTML page of a report view: no network fetch when it is opened.

Styles and the one small script are inline, charts are SVG drawn here, and a Content Security
Policy forbids every fetch (``default-src 'none'``), so the page shows the same thing on an
air-gapped laptop years later. Every value from evidence is escaped (docs/decision.md "Reports").
"""

from __future__ import annotations

from collections.abc import Sequence

# Every value is redacted and stripped of control characters before it is HTML-escaped.
from k3fleet.report.escapes import safe_html as escape
from k3fleet.report.view import Chart, ReportView

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"

_STYLE = """
:root { --ok:#1a7f37; --bad:#cf222e; --warn:#9a6700; --miss:#8250df; --muted:#57606a; }
* { box-sizing: border-box; }
body { font: 14px/1.45 "DejaVu Sans", system-ui, sans-serif; margin: 0; color: #1f2328; background: #f6f8fa; }
header { padding: 18px 28px; color: #fff; background: #24292f; }
header h1 { margin: 0 0 6px 0; font-size: 22px; }
header .meta { color: #d0d7de; font-size: 13px; }
main { padding: 12px 28px 40px 28px; max-width: 1400px; }
section { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; margin: 14px 0; padding: 12px 16px; }
h2 { font-size: 17px; margin: 4px 0 10px 0; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #eaeef2; padding: 5px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.evidence { color: var(--muted); font-size: 12px; word-break: break-all; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600;
         color: #fff; }
.s-pass, .o-go_live { background: var(--ok); }
.s-fail, .o-rebuild_environment { background: var(--bad); }
.s-missing, .s-error, .o-expand_capacity { background: var(--miss); }
.s-skipped, .s-warn, .s-unreachable, .o-observe_with_limits { background: var(--warn); }
.outcome { font-size: 20px; padding: 4px 14px; }
.verdict { display: flex; gap: 14px; align-items: center; flex-wrap: wrap; }
.chart { background: #fff; border: 1px solid #eaeef2; margin: 6px 12px 6px 0; }
.charts { display: flex; flex-wrap: wrap; }
.legend { font-size: 12px; }
.hidden { display: none; }
code { font-size: 12px; background: #f6f8fa; padding: 1px 4px; border-radius: 4px; }
"""

# Filters the tables to what needs attention; marks the page as rendered (a browser test reads it).
_SCRIPT = """
(function () {
  var box = document.getElementById('only-problems');
  function apply() {
    var rows = document.querySelectorAll('tr[data-status]');
    for (var i = 0; i < rows.length; i++) {
      var ok = rows[i].getAttribute('data-status') === 'pass';
      rows[i].classList.toggle('hidden', box.checked && ok);
    }
    var n = document.querySelectorAll('tr[data-status]:not([data-status="pass"])').length;
    document.getElementById('problem-count').textContent = n + ' item(s) need attention';
  }
  box.addEventListener('change', apply);
  apply();
  document.body.setAttribute('data-rendered', 'yes');
})();
"""

_PALETTE = ("#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#57606a")


def _badge(status: str, css: str = "s") -> str:
    return f'<span class="badge {css}-{escape(status)}">{escape(status)}</span>'


def _table(headers: Sequence[str], rows: Sequence[str], table_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def svg_chart(chart: Chart, width: int = 560, height: int = 300) -> str:
    """A line chart with axes, ticks and a legend, as inline SVG."""
    pad_l, pad_r, pad_t, pad_b = 56, 16, 28, 44
    xs = [x for s in chart.series for x, _ in s.points]
    ys = [y for s in chart.series for _, y in s.points]
    if not xs:
        return ""
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def px(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * w

    def py(y: float) -> float:
        return pad_t + h - (y - y0) / (y1 - y0) * h

    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(chart.title)}">',
             f'<text x="{pad_l}" y="16" font-size="13" font-weight="600">{escape(chart.title)}</text>',
             f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" stroke="#57606a"/>',
             f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + h}" stroke="#57606a"/>']
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        xv = x0 + (x1 - x0) * i / 4
        parts.append(f'<line x1="{pad_l}" y1="{py(yv):.1f}" x2="{pad_l + w}" y2="{py(yv):.1f}" stroke="#eaeef2"/>')
        parts.append(f'<text x="{pad_l - 6}" y="{py(yv) + 4:.1f}" font-size="10" text-anchor="end">{yv:.3g}</text>')
        parts.append(f'<text x="{px(xv):.1f}" y="{pad_t + h + 14}" font-size="10" text-anchor="middle">'
                     f'{xv:.3g}</text>')
    parts.append(f'<text x="{pad_l + w / 2:.1f}" y="{height - 6}" font-size="11" text-anchor="middle">'
                 f'{escape(chart.x_label)}</text>')
    parts.append(f'<text x="12" y="{pad_t + h / 2:.1f}" font-size="11" text-anchor="middle" '
                 f'transform="rotate(-90 12 {pad_t + h / 2:.1f})">{escape(chart.y_label)}</text>')
    for i, s in enumerate(chart.series):
        color = _PALETTE[i % len(_PALETTE)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        parts.append(f'<polyline class="series" data-label="{escape(s.label)}" fill="none" stroke="{color}" '
                     f'stroke-width="2" points="{pts}"/>')
        for x, y in s.points:
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"/>')
        parts.append(f'<text class="legend" x="{pad_l + 8 + (i % 3) * 160}" y="{pad_t + 12 + (i // 3) * 13}" '
                     f'fill="{color}" font-size="11">{escape(s.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(view: ReportView) -> str:
    sections: list[str] = []
    meta = " &middot; ".join(f"{escape(k)}: {escape(v)}" for k, v in view.meta)
    verdict = ""
    if view.outcome is not None:
        approval = ("" if view.approved is None else
                    _badge("approved", "s") if view.approved else '<span class="badge s-fail">NOT approved</span>')
        verdict = (f'<div class="verdict" id="decision" data-outcome="{escape(view.outcome)}" '
                   f'data-approved="{str(view.approved).lower()}">{_badge(view.outcome, "o outcome o")}{approval}'
                   f'<span>exit code {view.exit_code}</span></div>')
    elif view.exit_code is not None:
        verdict = f'<div class="verdict" id="decision"><span>exit code {view.exit_code}</span></div>'
    controls = ('<label><input type="checkbox" id="only-problems" checked> show only what needs attention</label> '
                '<span id="problem-count"></span>')
    sections.append(f'<section><h2>Summary</h2>{verdict}<p>{controls}</p></section>')
    if view.reasons:
        rows = [f'<li data-rule="{escape(r["rule"])}"><code>{escape(r["rule"])}</code> &rarr; '
                f'{escape(r["outcome"])}{" (" + escape(r["approval"]) + ")" if r.get("approval") else ""}: '
                f'{escape(r["text"])}'
                + (f' <span class="evidence">[{escape(r["evidence"])}]</span>' if r.get("evidence") else "") + "</li>"
                for r in view.reasons]
        sections.append(f'<section id="reasons"><h2>Why</h2><ul>{"".join(rows)}</ul></section>')
    if view.limits:
        rows = [f'<tr><td>{escape(lim["kind"])}</td><td>{escape(str(lim["value"]))}</td>'
                f'<td>{escape(lim.get("owner") or "")}</td><td>{escape(lim["text"])}</td></tr>' for lim in view.limits]
        sections.append(f'<section><h2>Limits</h2>{_table(["limit", "value", "owner", "what"], rows, "limits")}'
                        f'</section>')
    if view.checklist:
        rows = [f'<tr data-status="{escape(i["status"])}" data-item="{escape(i["id"])}">'
                f'<td>{escape(i["title"])}{" <em>(custom build)</em>" if i.get("track") == "custom" else ""}</td>'
                f'<td>{_badge(i["status"])}</td><td>{escape(i["detail"])}</td>'
                f'<td class="evidence">{escape(i.get("evidence") or "")}</td><td>{escape(i.get("owner") or "")}</td>'
                f'</tr>' for i in view.checklist]
        sections.append(f'<section><h2>Sign-off checklist</h2>'
                        f'{_table(["item", "status", "detail", "evidence", "owner"], rows, "checklist")}</section>')
    if view.hosts:
        rows = [f'<tr data-status="{"pass" if h.status == "pass" else escape(h.status)}" data-host="{escape(h.host)}">'
                f'<td>{escape(h.host)}</td><td>{_badge(h.status)}</td><td>{escape(h.driver or "")}</td>'
                f'<td>{escape(h.gpus or "")}</td><td>{escape(", ".join(h.findings))}</td></tr>' for h in view.hosts]
        table = _table(["host", "status", "driver", "GPUs", "findings"], rows, "hosts")
        sections.append(f"<section><h2>Hosts</h2>{table}</section>")
    problems = [c for c in view.checks if c.group not in ("checklist", "decision")]
    if problems:
        rows = [f'<tr data-status="{escape(c.status)}"><td>{escape(c.group)}</td><td><code>{escape(c.check)}</code>'
                f'</td><td>{_badge(c.status)}</td><td>{escape(c.message)}</td></tr>' for c in problems]
        sections.append(f'<section><h2>Findings per host and check</h2>'
                        f'{_table(["where", "check", "status", "message"], rows, "findings")}</section>')
    if view.timeline:
        rows = [f'<tr data-stage="{escape(t.stage)}"><td>{escape(t.ts or "(check)")}</td><td>{escape(t.host)}</td>'
                f'<td>{escape(t.stage)}</td><td>{escape(t.detail or "")}</td></tr>' for t in view.timeline]
        sections.append(f'<section><h2>Change-night timeline</h2>'
                        f'{_table(["time", "host", "stage", "detail"], rows, "timeline")}</section>')
    if view.charts:
        charts = "".join(svg_chart(c) for c in view.charts)
        sections.append(f'<section id="curves"><h2>Load curves</h2><div class="charts">{charts}</div></section>')
    if view.baseline:
        rows = [f'<tr><td>{escape(k)}</td><td><code>{escape(str(v))}</code></td></tr>'
                for k, v in view.baseline.items() if v not in (None, {}, []) and k != "evidence"]
        sections.append(f'<section id="baseline"><h2>Accepted baseline (serving rollback artifact)</h2>'
                        f'{_table(["setting", "value"], rows, "baseline-table")}</section>')
    if view.notes:
        sections.append('<section><h2>Notes</h2><ul>' + "".join(f"<li>{escape(n)}</li>" for n in view.notes)
                        + "</ul></section>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(view.title)}</title><style>{_STYLE}</style></head>"
        f'<body data-kind="{escape(view.kind)}"><header><h1>{escape(view.title)}</h1>'
        f'<div class="meta">{meta}</div></header><main>{"".join(sections)}</main>'
        f"<script>{_SCRIPT}</script></body></html>\n"
    )
