"""The renderers on one view built from load rows shaped as ``accept load`` writes them (docs/acceptance.md):
charts per phase in the HTML, a schema-valid JUnit file, a textfile prometheus-client parses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from k3fleet.evidence.writer import write_output
from k3fleet.report.html import render_html
from k3fleet.report.junit import render_junit
from k3fleet.report.prom import render_prom
from k3fleet.report.view import CheckRow, ReportView, load_charts

XSD = Path(__file__).resolve().parents[1] / "fixtures" / "report" / "junit-10.xsd"


def _rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for ctx in (256, 1024, 4096):
        rows.append({"phase": "long_input", "step": f"{ctx} tokens", "concurrency": 1, "prompt_tokens_mean": ctx,
                     "ttft_p50_s": ctx / 20000, "ttft_p95_s": ctx / 15000, "e2e_p50_s": 0.2, "itl_p50_s": 0.01,
                     "running_max": 1, "waiting_max": 0, "kv_usage_max": ctx / 65536})
    for c in (1, 2, 4, 8):
        rows.append({"phase": "agent_ramp", "step": f"{c} sessions", "concurrency": c, "t_start_s": 10 + c,
                     "ttft_p50_s": 0.05 * c, "ttft_p95_s": 0.08 * c, "running_max": min(c, 4),
                     "waiting_max": max(0, c - 4), "kv_usage_max": None})
    return rows


def _view() -> ReportView:
    v = ReportView(kind="decision", run="20261201T000000Z-decision-abc123", title="k3fleet decision: <go_live>",
                   outcome="observe_with_limits", approved=True, exit_code=0)
    v.checks = [CheckRow("gpu-a01", "driver.branch", "fail", "driver 575.57.08 is on R575 & old", "critical"),
                CheckRow("gpu-a01", "gpu.count", "pass"),
                CheckRow("gpu-a09", "driver.branch", "skipped", "unreachable"),
                CheckRow("checklist", "load.long_input", "error", "missing evidence\x07 with a control character"),
                CheckRow("gpu-a01", "driver.branch", "fail", "the same check twice keeps a unique name")]
    v.checklist = [{"id": "load.long_input", "title": "Long-input curves", "status": "missing", "detail": "none"}]
    v.charts = load_charts(_rows())
    return v


def test_load_rows_become_charts_per_phase() -> None:
    charts = {c.title: c for c in load_charts(_rows())}
    assert set(charts) == {"long_input: latency", "long_input: queue", "long_input: KV cache", "agent_ramp: latency",
                           "agent_ramp: queue"}
    assert charts["long_input: latency"].x_label == "prompt tokens"
    assert [x for x, _ in charts["agent_ramp: queue"].series[1].points] == [1.0, 2.0, 4.0, 8.0]


def test_html_is_escaped_self_contained_and_draws_every_series() -> None:
    html = render_html(_view())
    assert "&lt;go_live&gt;" in html and "<go_live>" not in html
    assert "R575 &amp; old" in html
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert html.count('class="chart"') == 5 and html.count("<polyline") == 4 + 2 + 1 + 2 + 2
    assert 'data-outcome="observe_with_limits"' in html


def test_junit_is_valid_and_counts_each_status() -> None:
    import xml.etree.ElementTree as ET

    import xmlschema

    text = render_junit(_view())
    xmlschema.XMLSchema(XSD).validate(text)
    root = ET.fromstring(text)
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("5", "2", "1")
    names = [(c.get("classname"), c.get("name")) for c in root.iter("testcase")]
    assert len(names) == len(set(names))
    assert "\x07" not in text


def test_prom_textfile_parses_and_is_written_atomically(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = render_prom(_view())
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    status = {(s.labels["host"], s.labels["check"]): s.labels["status"] for s in fams["k3fleet_check_status"].samples}
    assert status[("gpu-a09", "driver.branch")] == "skipped"
    assert {s.labels["outcome"]: s.value for s in fams["k3fleet_decision_outcome"].samples}["observe_with_limits"] == 1
    dest = tmp_path / "k3fleet.prom"
    write_output(dest, text.encode(), "--out")
    write_output(dest, text.encode(), "--out", force=True)  # the textfile collector's file, replaced in place
    assert dest.read_text() == text and [p.name for p in tmp_path.iterdir()] == ["k3fleet.prom"]
    assert oct(dest.stat().st_mode & 0o777) == "0o644"


def test_atomic_write_refuses_a_directory_and_a_missing_parent(tmp_path: Path) -> None:
    from k3fleet.errors import UsageError

    with pytest.raises(UsageError, match="is a directory"):
        write_output(tmp_path, b"x", "--out")
    with pytest.raises(UsageError, match="does not exist"):
        write_output(tmp_path / "no" / "f.prom", b"x", "--out")


def test_gpu_curves_and_open_loop_rows_are_drawn() -> None:
    from k3fleet.report.view import gpu_charts

    gpu = {"curves": {"agent_ramp": {"host/0": [[0.0, 100.0, 900.0, 91.0, 0.0], [1.0, 400.0, 600.0, 500.0, 80.0]],
                                     "host/1": [[0.0, 120.0, 880.0, None, None]]}}}
    charts = {c.title: c for c in gpu_charts(gpu)}
    assert set(charts) == {"agent_ramp: GPU memory used", "agent_ramp: GPU power", "agent_ramp: GPU utilisation"}
    assert [s.label for s in charts["agent_ramp: GPU memory used"].series] == ["GPU host/0", "GPU host/1"]
    assert charts["agent_ramp: GPU power"].series[0].points == [(0.0, 91.0), (1.0, 500.0)]
    assert gpu_charts(None) == [] == gpu_charts({"curves": "bad"})
    rate = [{"phase": "rate_ramp", "rate_rps": r, "goodput": g, "ttft_p95_s": 0.1 * r} for r, g in ((2, 1.0), (4, 0.5))]
    titles = {c.title: c for c in load_charts(rate)}
    assert titles["rate_ramp: goodput"].x_label == "requests per second"
    view = _view()
    view.charts = gpu_charts(gpu)
    html = render_html(view)
    assert "GPU memory used" in html and html.count('class="chart"') == 3


def _ticks(svg: str) -> tuple[list[str], list[str]]:
    """(y tick labels, x tick labels) of one chart, in drawing order."""
    ys = re.findall(r'<text class="tick" x="[\d.]+" y="[\d.]+" font-size="10" text-anchor="end">([^<]*)</text>', svg)
    xs = re.findall(r'<text class="tick" x="[\d.]+" y="[\d.]+" font-size="10" text-anchor="middle">([^<]*)</text>',
                    svg)
    return ys, xs


def test_a_small_kv_usage_has_readable_ticks_and_a_phase_shares_its_x_axis() -> None:
    """KV usage of a few thousandths drew every tick as "0"; the queue panel of a phase had other x
    ticks than its latency panel when a series lacked a point. Now KV is a percentage with readable
    ticks, and the panels of a phase share one x range."""
    from k3fleet.report.html import svg_chart

    rows = [r for r in _rows() if r["phase"] == "long_input"]
    rows[0]["waiting_max"] = rows[0]["running_max"] = None  # the queue panel lacks the first point
    charts = {c.title: c for c in load_charts(rows)}
    kv = charts["long_input: KV cache"]
    assert kv.y_label == "percent used" and kv.series[0].points[0][1] == 256 / 65536 * 100
    y_kv, _ = _ticks(svg_chart(kv))
    assert len(set(y_kv)) == len(y_kv) > 2, y_kv
    small = load_charts([{**r, "kv_usage_max": float(r["kv_usage_max"]) / 100} for r in rows])  # type: ignore[arg-type]
    y_small, _ = _ticks(svg_chart(next(c for c in small if c.title.endswith("KV cache"))))
    assert len(set(y_small)) == len(y_small) and y_small[0] == "0" and y_small[1] != "0", y_small
    x_lat = _ticks(svg_chart(charts["long_input: latency"]))[1]
    x_queue = _ticks(svg_chart(charts["long_input: queue"]))[1]
    assert x_lat == x_queue, (x_lat, x_queue)


def test_the_baseline_reads_as_settings_not_python_literals() -> None:
    from k3fleet.report.decision_md import render_markdown

    v = _view()
    v.baseline = {"parallel": {"tensor_parallel_size": 8, "data_parallel_size": 2, "enable_expert_parallel": True},
                  "parsers": {"tool_call_parser": "kimi_k2", "reasoning_parser": None}, "runtime_env": {}}
    for text in (render_html(v), render_markdown(v)):
        assert "tensor_parallel_size=8, data_parallel_size=2, enable_expert_parallel=true" in text
        assert "tool_call_parser=kimi_k2, reasoning_parser=none" in text
        assert "{'" not in text and "': " not in text
