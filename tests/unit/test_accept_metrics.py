"""The /metrics reader against recorded real pages (tests/fixtures/metrics/SOURCES.md)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import httpx
import pytest

from k3fleet.accept.metrics import (
    Histogram,
    MetricsError,
    MetricsSnapshot,
    delta,
    metrics_url,
    parse_metrics,
    scrape,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
GLM = "zai-org/GLM-4.5"


def load(name: str, content_type: str | None = None) -> MetricsSnapshot:
    return parse_metrics((FIX / name).read_text(), content_type)


def test_v1_page_with_deprecated_and_current_names() -> None:
    snap = load("vllm_0.10.0_glm45_deprecated_and_new.prom", "text/plain; version=0.0.4; charset=utf-8")
    assert snap.exposition == "prometheus"
    assert snap.counter("vllm:prefix_cache_queries") == 32.0
    assert snap.counter("vllm:prefix_cache_queries_total") == 32.0
    assert snap.counter("vllm:prefix_cache_queries", model=GLM) == 32.0
    assert snap.counter("vllm:prefix_cache_queries", model="other/model") is None
    assert snap.gauge("vllm:kv_cache_usage_perc") == pytest.approx(9.75010481363281e-06)
    # The page was cut before the hits counter: missing is None, never 0.
    assert snap.counter("vllm:prefix_cache_hits") is None
    assert snap.counter("vllm:num_preemptions") is None
    # Deprecated names are listed, but the server has the current ones: not an old server.
    assert snap.old_names() == ["vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries"]
    assert snap.is_old_server is False
    assert snap.models() == [GLM]
    # The _created gauge (a unix timestamp) is never read as the counter.
    assert snap.counter("vllm:gpu_prefix_cache_hits") == 0.0


def test_old_server_is_reported_old_and_its_names_never_read_as_current() -> None:
    snap = load("vllm_v0_qwen25coder_old_names.prom")
    assert snap.is_old_server is True
    assert "vllm:gpu_cache_usage_perc" in snap.old_names()
    assert "vllm:gpu_prefix_cache_queries" in snap.old_names()
    assert snap.gauge("vllm:kv_cache_usage_perc") is None
    assert snap.counter("vllm:prefix_cache_queries") is None
    assert snap.gauge("vllm:num_requests_running") == 0.0
    assert snap.process_start_time() == pytest.approx(1.74262400557e9)
    assert snap.summary()["kv_usage"] is None


def test_openmetrics_counter_typed_by_base_name() -> None:
    snap = load("vllm_rust_frontend_gpustack6215.om", "application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert snap.exposition == "openmetrics"
    assert snap.counter("vllm:prompt_tokens") == 34567503.0
    assert snap.counter("vllm:prompt_tokens_total") == 34567503.0
    assert snap.has("vllm:prompt_tokens")


def test_both_formats_answer_the_same() -> None:
    prom = load("vllm_0.10.0_glm45_deprecated_and_new.prom")
    om = load("vllm_0.10.0_glm45_as_openmetrics.om")  # no content type: sniffed by its # EOF
    assert om.exposition == "openmetrics"
    for name in ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_hits"):
        assert om.counter(name) == prom.counter(name)
    assert om.gauge("vllm:kv_cache_usage_perc") == prom.gauge("vllm:kv_cache_usage_perc")
    assert "vllm:gpu_prefix_cache_hits" in om.old_names()
    assert om.is_old_server is False


def test_openmetrics_served_as_text_plain_still_parses() -> None:
    # A proxy that rewrites the content type: the page's own # EOF decides.
    snap = load("vllm_rust_frontend_gpustack6215.om", "text/plain")
    assert snap.counter("vllm:prompt_tokens") == 34567503.0


def test_engines_are_summed_and_fractions_take_the_fullest() -> None:
    snap = load("vllm_dp2_two_engines_synthetic.prom")
    assert snap.gauge("vllm:num_requests_running") == 8.0
    assert snap.counter("vllm:prefix_cache_queries") == 4128.0
    assert snap.gauge("vllm:kv_cache_usage_perc") == 0.75
    assert snap.gauge("vllm:kv_cache_usage_perc", agg="mean") == 0.5
    assert snap.gauge("vllm:num_requests_running", labels={"engine": "1"}) == 5.0
    h = snap.histogram("vllm:time_to_first_token_seconds")
    assert h is not None
    assert h.buckets == [(0.1, 1.0), (1.0, 5.0), (math.inf, 8.0)]
    assert (h.sum, h.count) == (8.5, 8.0)
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.9 * (4 - 1) / (5 - 1))
    assert h.quantile(0.99) == 1.0  # the +Inf bucket answers its lower edge


def test_histogram_cut_short_keeps_what_is_there() -> None:
    snap = load("vllm_v0_qwen25coder_request_prompt_tokens.prom")
    h = snap.histogram("vllm:request_prompt_tokens")
    assert h is not None and h.count is None and h.sum is None
    assert h.buckets[-1] == (10000.0, 31.0)
    docs = load("vllm_docs_llama32_1b_iteration_tokens.prom").histogram("vllm:iteration_tokens_total")
    assert docs is not None and docs.sum == 0.0 and docs.buckets[0] == (1.0, 3.0)
    assert load("vllm_docs_llama32_1b_iteration_tokens.prom").histogram("vllm:time_to_first_token_seconds") is None


def test_cache_config_labels() -> None:
    snap = load("vllm_design_cache_config_info.prom")
    cfg = snap.cache_config()
    assert cfg is not None and cfg["block_size"] == "16" and cfg["enable_prefix_caching"] == "False"
    assert snap.prefix_caching_enabled() is False
    assert load("vllm_dp2_two_engines_synthetic.prom").cache_config() is None
    assert load("vllm_dp2_two_engines_synthetic.prom").prefix_caching_enabled() is None


def test_delta_and_restart() -> None:
    before = load("vllm_0.10.0_glm45_deprecated_and_new.prom")
    after = load("vllm_dp2_two_engines_synthetic.prom")
    assert delta(before, after, "vllm:prefix_cache_queries") == 4096.0
    assert MetricsSnapshot.delta(before, after, "vllm:prefix_cache_queries_total") == 4096.0
    # Counter went down: the server restarted in the window; the rise is unknown, not negative.
    assert delta(after, before, "vllm:prefix_cache_queries") is None
    assert delta(before, after, "vllm:prefix_cache_hits") is None


def test_histogram_window() -> None:
    a = Histogram(buckets=[(0.1, 1.0), (math.inf, 2.0)], sum=1.0, count=2.0)
    b = Histogram(buckets=[(0.1, 4.0), (math.inf, 6.0)], sum=3.0, count=6.0)
    w = b.minus(a)
    assert w is not None and w.buckets == [(0.1, 3.0), (math.inf, 4.0)] and w.count == 4.0
    assert a.minus(b) is None
    assert Histogram().quantile(0.5) is None


@pytest.mark.parametrize("text,ctype", [
    ((FIX / "not_metrics_html_404.txt").read_text(), "text/html"),
    ((FIX / "not_metrics_html_404.txt").read_text(), None),
    ('{"iteration_stats": 1}', "application/json"),
    ("vllm:num_requests_running{engine=\"0\" 3\n", "text/plain"),
])
def test_not_exposition_text_is_one_line_error(text: str, ctype: str | None) -> None:
    with pytest.raises(MetricsError) as info:
        parse_metrics(text, ctype)
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 3


def test_empty_page_has_no_vllm_metrics() -> None:
    snap = parse_metrics("", "text/plain")
    assert snap.has_vllm is False and snap.counter("vllm:prompt_tokens") is None


def test_metrics_url() -> None:
    assert metrics_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/metrics"


def test_scrape_over_http_errors_are_one_line() -> None:
    page = (FIX / "vllm_rust_frontend_gpustack6215.om").read_text()

    def handler(request: httpx.Request) -> httpx.Response:
        assert "openmetrics" in request.headers["accept"]
        if request.url.host == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.host == "fail":
            return httpx.Response(503, text="overloaded")
        return httpx.Response(200, text=page, headers={"content-type": "application/openmetrics-text; version=1.0.0"})

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            snap = await scrape(client, "http://ok:8000/v1")
            assert snap.counter("vllm:prompt_tokens") == 34567503.0
            with pytest.raises(MetricsError, match="cannot read http://down:8000/metrics"):
                await scrape(client, "http://down:8000")
            with pytest.raises(MetricsError, match="answered 503"):
                await scrape(client, "http://fail:8000")

    asyncio.run(run())
