"""A self-contained HTML page of a report view: no network fetch when it is opened.

Styles and the one small script are inline, charts are SVG drawn here, and a Content Security
Policy forbids every fetch (``default-src 'none'``), so the page shows the same thing on an
air-gapped laptop years later. Every value from evidence is escaped (docs/decision.md "Reports").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

# Every value is redacted and stripped of control characters before it is HTML-escaped.
from k3fleet.contracts import OUTCOME_STATUS
from k3fleet.report.escapes import safe_html as escape
from k3fleet.report.plan import package_groups, plan_lines, plan_title
from k3fleet.report.view import (
    STATUS_ORDER,
    Chart,
    GpuHost,
    HeatMap,
    ReportView,
    approval_words,
    plain_number,
    plain_value,
)

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
.s-pass { background: var(--ok); }
.s-fail { background: var(--bad); }
.s-missing, .s-error { background: var(--miss); }
.s-skipped, .s-warn, .s-unreachable { background: var(--warn); }
.outcome { font-size: 20px; padding: 4px 14px; }
.verdict { display: flex; gap: 14px; align-items: center; flex-wrap: wrap; }
.chart { background: #fff; border: 1px solid #eaeef2; margin: 6px 12px 6px 0; }
.charts { display: flex; flex-wrap: wrap; }
.legend { font-size: 12px; }
.hidden { display: none; }
code { font-size: 12px; background: #f6f8fa; padding: 1px 4px; border-radius: 4px; }
.counts { display: flex; gap: 10px; flex-wrap: wrap; margin: 8px 0; }
.count { border: 1px solid #d0d7de; border-radius: 6px; padding: 4px 10px; font-size: 13px; }
.count b { font-size: 16px; }
.scroll { max-height: 560px; overflow: auto; border: 1px solid #eaeef2; }
.scroll thead th { position: sticky; top: 0; z-index: 1; }
table.heat { width: auto; font-size: 11px; }
table.heat td, table.heat th { padding: 1px 6px; border-bottom: 1px solid #fff; white-space: nowrap; }
table.heat th { cursor: pointer; user-select: none; }
table.heat th.sorted::after { content: " \\25BC"; font-size: 9px; }
table.heat td.c { width: 64px; text-align: center; color: #fff; font-size: 10px; }
table.heat tr.total td { background: #f6f8fa; color: #1f2328; font-weight: 600; position: sticky; top: 21px; }
.c-pass { background: #d1f0d9; color: #1a7f37 !important; }
.c-warn { background: #d4a72c; }
.c-fail { background: var(--bad); }
.c-error { background: var(--miss); }
.c-skipped { background: #8c959f; }
.gpus td.g { width: 22px; height: 18px; padding: 0; border: 1px solid #fff; position: relative; }
.gpus td.g span { position: absolute; left: 0; bottom: 0; width: 100%; background: rgba(0,0,0,.25); }
.fix { color: #1f2328; }
td.hosts { min-width: 240px; max-width: 360px; color: var(--muted); font-size: 12px; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(380px, 1fr)); gap: 10px; }
.probe { border: 1px solid #eaeef2; border-radius: 6px; padding: 8px 12px; }
.probe h3 { font-size: 14px; margin: 0 0 6px 0; }
.probe table td { padding: 2px 6px; font-size: 13px; }
.probe table td:last-child { font-variant-numeric: tabular-nums; text-align: right; }
.plan li { margin: 2px 0; }
.next { font-size: 15px; background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px; padding: 6px 10px; }
.filtered { color: #57606a; font-style: italic; margin: 4px 0; }
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
    var hid = document.querySelectorAll('tr[data-status].hidden').length;
    document.getElementById('problem-count').textContent = n + ' item(s) need attention' +
      (hid ? '; ' + hid + ' passed row(s) hidden' : '');
    // Each filtered table says what it hides: a checklist whose 21 items pass is not an empty table.
    var tables = document.querySelectorAll('table');
    for (var t = 0; t < tables.length; t++) {
      var all = tables[t].querySelectorAll('tr[data-status]');
      if (!all.length) { continue; }
      var gone = tables[t].querySelectorAll('tr[data-status].hidden').length;
      var note = tables[t].parentNode.querySelector('p.filtered[data-for="' + t + '"]');
      if (!note) {
        note = document.createElement('p');
        note.className = 'filtered';
        note.setAttribute('data-for', String(t));
        tables[t].parentNode.insertBefore(note, tables[t].nextSibling);
      }
      note.textContent = gone ? gone + ' of ' + all.length + ' row(s) pass and are hidden: untick "show only ' +
        'what needs attention" to see them' : '';
    }
  }
  box.addEventListener('change', apply);
  apply();
  // The heat map sorts by a column when its header is clicked: worst status first, then by host.
  var heat = document.getElementById('heatmap');
  if (heat) {
    var rank = {fail: 0, error: 1, warn: 2, skipped: 3, pass: 4};
    var heads = heat.querySelectorAll('th[data-col]');
    for (var h = 0; h < heads.length; h++) {
      heads[h].addEventListener('click', function (ev) {
        var col = ev.currentTarget.getAttribute('data-col');
        var body = heat.querySelector('tbody');
        var rows = Array.prototype.slice.call(body.querySelectorAll('tr[data-host]'));
        rows.sort(function (a, b) {
          if (col === 'host') { return a.getAttribute('data-host') < b.getAttribute('data-host') ? -1 : 1; }
          var d = rank[a.getAttribute('data-' + col)] - rank[b.getAttribute('data-' + col)];
          return d !== 0 ? d : (a.getAttribute('data-host') < b.getAttribute('data-host') ? -1 : 1);
        });
        for (var r = 0; r < rows.length; r++) { body.appendChild(rows[r]); }
        for (var k = 0; k < heads.length; k++) { heads[k].classList.toggle('sorted', heads[k] === ev.currentTarget); }
      });
    }
  }
  document.body.setAttribute('data-rendered', 'yes');
})();
"""

_PALETTE = ("#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#57606a")
# Axis labels that count things (requests, sessions, tokens): their ticks are whole numbers.
_COUNT_AXES = ("requests", "concurrent sessions", "prompt tokens", "tokens", "sessions")


def _badge(status: str, css: str = "s") -> str:
    return f'<span class="badge {css}-{escape(status)}">{escape(status)}</span>'


def _outcome_badge(outcome: str) -> str:
    """The outcome in its report status's colour (k3fleet.contracts.OUTCOME_STATUS)."""
    status = OUTCOME_STATUS.get(outcome, "missing")  # type: ignore[call-overload]
    return f'<span class="badge outcome s-{status}">{escape(outcome)}</span>'


def _section(title: str, headers: list[str], rows: list[str], table_id: str, *, sid: str | None = None) -> str:
    """A report section: its heading (plain text, not escaped) over one table."""
    attr = f' id="{sid}"' if sid else ""
    return f"<section{attr}><h2>{title}</h2>{_table(headers, rows, table_id)}</section>"


def _table(headers: Sequence[str], rows: Sequence[str], table_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def nice_ticks(lo: float, hi: float, integer: bool = False, count: int = 5) -> list[float]:
    """Ticks at 1, 2 or 5 x 10^k covering [lo, hi]; whole numbers only where the axis counts things."""
    span = hi - lo if hi > lo else abs(hi) or 1.0
    raw = span / max(count - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, math.ceil(step))
    first = math.floor(lo / step) * step
    ticks: list[float] = [round(first, 10)]
    # Up to the first tick at or past the highest value: no line runs beyond the last label.
    while ticks[-1] < hi and len(ticks) < 20:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def svg_chart(chart: Chart, width: int = 560, height: int = 300, slo: tuple[str, float] | None = None) -> str:
    """A line chart with axes, plain-number ticks, an optional SLO line and a legend below the plot."""
    xs = [x for s in chart.series for x, _ in s.points]
    ys = [y for s in chart.series for _, y in s.points]
    if not xs:
        return ""
    labels = [s.label for s in chart.series] + ([slo[0]] if slo else [])
    per_row = 3
    legend_rows = math.ceil(len(labels) / per_row)
    pad_l, pad_r, pad_t, pad_b = 60, 20, 28, 46 + 16 * legend_rows
    height += 16 * legend_rows
    x_lo, x_hi = chart.x_range if chart.x_range is not None else (min(xs), max(xs))
    x_ticks = nice_ticks(min(x_lo, min(xs)), max(x_hi, max(xs)), integer=chart.x_label in _COUNT_AXES)
    y_hi = max([*ys, slo[1] if slo else 0.0])
    y_ticks = nice_ticks(min(0.0, min(ys)), y_hi, integer=chart.y_label in _COUNT_AXES)
    x0, x1 = x_ticks[0], x_ticks[-1]
    y0, y1 = y_ticks[0], y_ticks[-1]
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
    for yv in y_ticks:
        parts.append(f'<line x1="{pad_l}" y1="{py(yv):.1f}" x2="{pad_l + w}" y2="{py(yv):.1f}" stroke="#eaeef2"/>')
        parts.append(f'<text class="tick" x="{pad_l - 6}" y="{py(yv) + 4:.1f}" font-size="10" text-anchor="end">'
                     f'{escape(plain_number(yv))}</text>')
    for xv in x_ticks:
        parts.append(f'<text class="tick" x="{px(xv):.1f}" y="{pad_t + h + 14}" font-size="10" '
                     f'text-anchor="middle">{escape(plain_number(xv))}</text>')
    parts.append(f'<text x="{pad_l + w / 2:.1f}" y="{pad_t + h + 32}" font-size="11" text-anchor="middle">'
                 f'{escape(chart.x_label)}</text>')
    parts.append(f'<text x="12" y="{pad_t + h / 2:.1f}" font-size="11" text-anchor="middle" '
                 f'transform="rotate(-90 12 {pad_t + h / 2:.1f})">{escape(chart.y_label)}</text>')
    for i, s in enumerate(chart.series):
        color = _PALETTE[i % len(_PALETTE)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        parts.append(f'<polyline class="series" data-label="{escape(s.label)}" fill="none" stroke="{color}" '
                     f'stroke-width="2" points="{pts}"/>')
        for x, y in s.points:
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"><title>'
                         f'{escape(s.label)}: {escape(plain_number(y))} at {escape(plain_number(x))}</title></circle>')
    if slo:
        parts.append(f'<line class="slo" data-label="{escape(slo[0])}" x1="{pad_l}" y1="{py(slo[1]):.1f}" '
                     f'x2="{pad_l + w}" y2="{py(slo[1]):.1f}" stroke="#cf222e" stroke-dasharray="6 4"/>')
    # The legend sits below the x-axis label: it never covers a line.
    for i, label in enumerate(labels):
        is_slo = slo is not None and i == len(labels) - 1
        color = "#cf222e" if is_slo else _PALETTE[i % len(_PALETTE)]
        lx, ly = pad_l + (i % per_row) * 165, pad_t + h + 50 + (i // per_row) * 16
        mark = (f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 14}" y2="{ly - 4}" stroke="{color}" stroke-width="2"'
                + (' stroke-dasharray="4 3"' if is_slo else "") + "/>")
        parts.append(f'{mark}<text class="legend" x="{lx + 18}" y="{ly}" fill="#1f2328" font-size="11">'
                     f'{escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _hosts_cell(hosts: Sequence[str], shown: int = 6) -> str:
    """A few host names, the rest behind a disclosure: a cell stays one or two lines at 1,000 hosts."""
    if len(hosts) <= shown:
        return escape(", ".join(hosts))
    return (f"<b>{len(hosts):,} hosts</b>: {escape(', '.join(hosts[:shown]))}, ... <details><summary>all "
            f"{len(hosts):,}</summary>{escape(', '.join(hosts))}</details>")


def _long(text: str, keep: int = 320) -> str:
    """A long text (a rule naming 700 hosts) cut to its start, the whole behind a disclosure."""
    if len(text) <= keep + 80:
        return escape(text)
    return f"{escape(text[:keep])}... <details><summary>all {len(text):,} characters</summary>{escape(text)}</details>"


def _counts_line(items: Sequence[tuple[str, int]]) -> str:
    return '<div class="counts">' + "".join(
        f'<span class="count"><b>{n:,}</b> {escape(label)}</span>' for label, n in items) + "</div>"


def heatmap_html(hm: HeatMap) -> str:
    """Hosts x check groups, worst status per cell, worst hosts first; the headers sort it."""
    rank = {st: i for i, st in enumerate(STATUS_ORDER)}
    rows = sorted(hm.rows, key=lambda r: (min((rank.get(c, 9) for c in r.cells), default=9), r.host))
    head = ('<th data-col="host">host</th><th data-col="status">status</th>'
            + "".join(f'<th data-col="g-{escape(g)}">{escape(g)}</th>' for g in hm.groups))
    totals = []
    for i, _g in enumerate(hm.groups):
        bad = [r.cells[i] for r in hm.rows if r.cells[i] != "pass"]
        fail = sum(1 for c in bad if c in ("fail", "error"))
        warn = sum(1 for c in bad if c == "warn")
        totals.append(f'<td class="c" style="color:#1f2328">{fail or ""}{"/" if fail and warn else ""}'
                      f'{warn or ""}</td>' if bad else '<td class="c"></td>')
    body = [f'<tr class="total"><td>hosts failing / warning</td><td></td>{"".join(totals)}</tr>']
    for r in rows:
        attrs = " ".join(f'data-g-{escape(g)}="{escape(c)}"' for g, c in zip(hm.groups, r.cells, strict=True))
        cells = "".join(f'<td class="c c-{escape(c)}" title="{escape(r.host)} {escape(g)}: {escape(c)}">'
                        f'{"" if c == "pass" else escape(c)}</td>' for g, c in zip(hm.groups, r.cells, strict=True))
        st = "fail" if r.status == "fail" else "warn" if r.status == "warn" else "skipped" \
            if r.status == "unreachable" else "pass"
        body.append(f'<tr data-host="{escape(r.host)}" data-status-h="{escape(r.status)}" data-status="{st}" '
                    f'{attrs}><td>{escape(r.host)}</td><td class="c c-{st}">{escape(r.status)}</td>{cells}</tr>')
    by = Counter(r.status for r in hm.rows)
    counts = _counts_line([(f"{st}", n) for st, n in sorted(by.items(), key=lambda kv: -kv[1])])
    return (f'<section id="heat"><h2>Fleet heat map: {len(hm.rows):,} hosts x {len(hm.groups)} check groups</h2>'
            f'{counts}<p>Each cell is the worst status of the group\'s checks on the host; click a header to sort '
            f'(worst first).</p><div class="scroll"><table class="heat" id="heatmap"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div></section>')


def gpus_html(hosts: Sequence[GpuHost]) -> str:
    """Per GPU: memory in use (the dark fill) and health; hosts whose GPUs are all healthy and idle fold."""
    models: dict[str, list[Any]] = {}
    for h in hosts:
        for g in h.gpus:
            models.setdefault(g.name, []).append(g)
    rows = [f"<tr><td>{escape(m)}</td><td>{len(gs):,}</td>"
            f"<td>{escape(plain_number(min((g.memory_total_mib or 0) for g in gs) / 1024, 'GiB'))}</td>"
            f"<td>{sum(1 for g in gs if g.memory_used_mib):,}</td>"
            f"<td>{sum(1 for g in gs if g.status == 'fail'):,}</td><td>{sum(1 for g in gs if g.status == 'warn'):,}"
            f"</td></tr>" for m, gs in sorted(models.items())]
    summary = _table(["GPU model", "GPUs", "memory per GPU", "memory in use", "unhealthy", "warning"], rows,
                     "gpu-models")
    attention = [h for h in hosts if h.needs_attention]
    grid = []
    for h in attention:
        if h.unreadable:
            problems = ["no GPU could be read", *h.faults]
            grid.append(f'<tr data-host="{escape(h.host)}" data-unreadable="true"><td>{escape(h.host)}</td>'
                        f'<td class="g c-error" title="{escape(h.host)}: no GPU could be read"></td>'
                        f'<td class="evidence">{escape("; ".join(problems))}</td></tr>')
            continue
        cells = []
        for g in h.gpus:
            used = (g.memory_used_mib or 0) / g.memory_total_mib if g.memory_total_mib else 0
            tip = (f"{h.host} GPU {g.index} {g.name}: {plain_number(g.memory_used_mib or 0)} of "
                   f"{plain_number(g.memory_total_mib)} MiB in use" + ("; " + "; ".join(g.problems) if g.problems
                                                                        else ""))
            cells.append(f'<td class="g c-{escape(g.status)}" title="{escape(tip)}" data-gpu="{g.index}">'
                         f'<span style="height:{min(used, 1) * 100:.0f}%"></span></td>')
        problems = [*h.faults, *sorted({p for g in h.gpus for p in g.problems})]
        fault = ' data-fault="true"' if h.faults else ""
        grid.append(f'<tr data-host="{escape(h.host)}"{fault}><td>{escape(h.host)}</td>{"".join(cells)}'
                    f'<td class="evidence">{escape("; ".join(problems))}</td></tr>')
    healthy = len(hosts) - len(attention)
    named = ", ".join(h.host for h in attention[:8]) + (f" and {len(attention) - 8:,} more" if len(attention) > 8
                                                          else "")
    lead = (f'<p class="attention">{len(attention):,} host(s) need attention: {escape(named)}.</p>'
            if attention else "")
    fold = (f"<p>{healthy:,} {'other ' if attention else ''}host(s): every GPU healthy and idle.</p>"
            if healthy else "")
    table = (f'<div class="scroll"><table class="gpus" id="gpu-grid"><tbody>{"".join(grid)}</tbody></table></div>'
             if grid else "")
    return (f'<section id="gpus"><h2>GPUs: memory and health</h2>{lead}{summary}'
            f"<p>Each square is one GPU: green healthy, yellow a warning (memory in use, clocks held, a narrow "
            f"PCIe link), red a fault (ECC, row remapping, fabric); the dark fill is the memory in use. A host's "
            f"failed GPU checks (an Xid, NVML unreadable) are named beside its row.</p>"
            f"{table}{fold}</section>")


def render_html(view: ReportView) -> str:
    sections: list[str] = []
    meta = " &middot; ".join(f"{escape(k)}: {escape(v)}" for k, v in view.meta)
    verdict = ""
    if view.outcome is not None:
        approval = ("" if view.approved is None else
                    _badge("approved", "s") if view.approved else
                    f'<span class="badge s-fail">{escape(approval_words(False, view.draft))}</span>')
        verdict = (f'<div class="verdict" id="decision" data-outcome="{escape(view.outcome)}" '
                   f'data-approved="{str(view.approved).lower()}">{_outcome_badge(view.outcome)}{approval}'
                   f'<span>exit code {view.exit_code}</span></div>')
    elif view.exit_code is not None:
        verdict = f'<div class="verdict" id="decision"><span>exit code {view.exit_code}</span></div>'
    # A decision is read whole (the sign-off checklist is what is signed): its filter starts off. An audit's
    # hundreds of passing hosts start hidden, and every table says how many it hides.
    checked = "" if view.kind == "decision" else " checked"
    controls = (f'<label><input type="checkbox" id="only-problems"{checked}> show only what needs attention</label> '
                '<span id="problem-count"></span>')
    next_line = (f'<p class="next" id="next"><strong>Do this next:</strong> {escape(view.next_step)}</p>'
                 if view.next_step else "")
    counts = ""
    if view.hosts:
        by = Counter(h.status for h in view.hosts)
        to_fix = sum(1 for f in view.findings if f.status in ("fail", "error"))
        counts = _counts_line([("hosts", len(view.hosts)), *sorted(by.items(), key=lambda kv: -kv[1]),
                               ("findings to fix", to_fix)])
    probes = ""
    if view.probes:
        cards = []
        for p in view.probes:
            figs = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in p.figures)
            cards.append(f'<div class="probe" data-probe="{escape(p.name)}"><h3>{escape(p.name)} {_badge(p.status)}'
                         f'</h3><div>{escape(p.reason)}</div><table>{figs}</table></div>')
        probes = f'<div class="figures" id="probes">{"".join(cards)}</div>'
    sections.append(f'<section><h2>Summary</h2>{next_line}{verdict}{counts}{probes}<p>{controls}</p></section>')
    if view.reasons:
        rows = [f'<li data-rule="{escape(r["rule"])}"><code>{escape(r["rule"])}</code> &rarr; '
                f'{escape(r["outcome"])}{" (" + escape(r["approval"]) + ")" if r.get("approval") else ""}: '
                f'{_long(r["text"])}'
                + (f' <span class="evidence">[{escape(r["evidence"])}]</span>' if r.get("evidence") else "") + "</li>"
                for r in view.reasons]
        sections.append(f'<section id="reasons"><h2>Why</h2><ul>{"".join(rows)}</ul></section>')
    if view.limits:
        rows = [f'<tr><td>{escape(lim["kind"])}</td><td>{escape(str(lim["value"]))}</td>'
                f'<td>{escape(lim.get("owner") or "")}</td><td>{escape(lim["text"])}</td></tr>' for lim in view.limits]
        sections.append(_section("Limits", ["limit", "value", "owner", "what"], rows, "limits"))
    if view.checklist:
        rows = [f'<tr data-status="{escape(i["status"])}" data-item="{escape(i["id"])}">'
                f'<td>{escape(i["title"])}{" <em>(custom build)</em>" if i.get("track") == "custom" else ""}</td>'
                f'<td>{_badge(i["status"])}</td><td>{_long(i["detail"])}</td>'
                f'<td class="evidence">{_long(i.get("evidence") or "", 160)}</td>'
                f'<td>{escape(i.get("owner") or "")}</td></tr>' for i in view.checklist]
        sections.append(_section("Sign-off checklist", ["item", "status", "detail", "evidence", "owner"], rows,
                                 "checklist"))
    if view.heatmap is not None and view.heatmap.rows:
        sections.append(heatmap_html(view.heatmap))
    if view.findings:
        rows = []
        for f in view.findings:
            rows.append(f'<tr data-status="{escape(f.status)}" data-check="{escape(f.check)}"><td>{_badge(f.status)}'
                        f' <small>{escape(f.severity)}</small></td><td><code>{escape(f.check)}</code></td>'
                        f'<td class="hosts">{_hosts_cell(f.hosts)}</td><td>{escape(f.message)}</td>'
                        f'<td class="fix">{escape(f.fix or "")}</td></tr>')
        sections.append(_section("Findings and fixes", ["status", "check", "hosts", "finding", "fix"], rows,
                                 "findings-fixes", sid="fixes"))
    if view.plan:
        items = "".join(f"<li>{escape(line)}</li>" for line in plan_lines(view.plan, limit=60))
        groups = package_groups(view.plan)
        tx = _table(["hosts", "package transaction"], [
            f'<tr><td class="hosts">{_hosts_cell(h)}</td><td><code>{escape(t)}</code></td></tr>'
            for t, h in groups], "transactions") if groups else ""
        sections.append(f'<section id="plan" class="plan"><h2>{escape(plan_title(view.plan))}</h2><ul>{items}</ul>'
                        f'{tx}</section>')
    if view.gpus:
        sections.append(gpus_html(view.gpus))
    if view.hosts:
        rows = [f'<tr data-status="{"pass" if h.status == "pass" else escape(h.status)}" data-host="{escape(h.host)}">'
                f'<td>{escape(h.host)}</td><td>{_badge(h.status)}</td><td>{escape(h.driver or "")}</td>'
                f'<td>{escape(h.gpus or "")}</td><td>{escape(", ".join(h.findings))}</td></tr>' for h in view.hosts]
        table = _table(["host", "status", "driver", "GPUs", "findings"], rows, "hosts")
        sections.append(f'<section><h2>Hosts</h2><div class="scroll">{table}</div></section>')
    problems = [] if view.findings else view.folded_problems()
    if problems:
        rows = [f'<tr data-status="{escape(c.status)}"><td>{escape(c.group)}</td><td><code>{escape(c.check)}</code>'
                f'</td><td>{_badge(c.status)}</td><td>{escape(c.message)}</td></tr>' for c, _ in problems]
        sections.append(_section("Checks not passed", ["where", "check", "status", "message"], rows, "findings"))
    if view.timeline:
        rows = [f'<tr data-stage="{escape(t.stage)}"><td>{escape(t.ts or "(check)")}</td><td>{escape(t.host)}</td>'
                f'<td>{escape(t.stage)}</td><td>{escape(t.detail or "")}</td></tr>' for t in view.timeline]
        sections.append(_section("Change-night timeline", ["time", "host", "stage", "detail"], rows, "timeline"))
    if view.charts:
        charts = "".join(svg_chart(c, slo=next((v for k, v in view.slo.items() if c.title.endswith(k)), None))
                         for c in view.charts)
        sections.append(f'<section id="curves"><h2>Load curves</h2><div class="charts">{charts}</div></section>')
    if view.baseline:
        rows = [f'<tr><td>{escape(k)}</td><td><code>{escape(plain_value(v))}</code></td></tr>'
                for k, v in view.baseline.items() if v not in (None, {}, []) and k != "evidence"]
        sections.append(_section("Accepted baseline (serving rollback artifact)", ["setting", "value"], rows,
                                 "baseline-table", sid="baseline"))
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
