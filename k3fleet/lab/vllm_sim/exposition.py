"""The simulator's ``/metrics`` page: vLLM's names and labels, rendered by prometheus-client.

Current names by default; ``old_metric_names`` renders a pre-0.12 server instead (only the removed
names, no replacements). ``metrics_format`` picks Prometheus text 0.0.4 (vLLM's Python server) or
OpenMetrics 1.0 (its Rust frontend). Names and their sources: docs/acceptance-load.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest as _render_prometheus
from prometheus_client.openmetrics.exposition import generate_latest as _render_openmetrics

from k3fleet.lab.vllm_sim.engine import Engine, Hist

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_LABELS = ["model_name", "engine"]


class _SimCollector:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _hist(self, name: str, doc: str, hist: Hist, values: list[str]) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=_LABELS)
        fam.add_metric(values, hist.cumulative(), hist.sum)
        return fam

    def collect(self) -> Iterator[Metric]:
        eng = self.engine
        cfg = eng.cfg
        st = eng.stats
        kv = eng.kv
        lv = [cfg.model, "0"]
        old = cfg.old_metric_names

        start = GaugeMetricFamily("process_start_time_seconds",
                                  "Start time of the process since unix epoch in seconds.")
        start.add_metric([], eng.started_at)
        yield start

        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", eng.reported_running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", eng.reported_waiting),
        ):
            g = GaugeMetricFamily(name, doc, labels=_LABELS)
            g.add_metric(lv, float(value))
            yield g

        usage_name = "vllm:gpu_cache_usage_perc" if old else "vllm:kv_cache_usage_perc"
        g = GaugeMetricFamily(usage_name, "KV-cache usage. 1 means 100 percent usage.", labels=_LABELS)
        g.add_metric(lv, kv.usage)
        yield g

        prefix = "vllm:gpu_prefix_cache" if old else "vllm:prefix_cache"
        for name, doc, value in (
            (f"{prefix}_queries", "Prefix cache queries, in terms of number of queried tokens.", kv.queries),
            (f"{prefix}_hits", "Prefix cache hits, in terms of number of cached tokens.", kv.hits),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", st.preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", st.generation_tokens),
        ):
            c = CounterMetricFamily(name, doc, labels=_LABELS)
            c.add_metric(lv, float(value))
            yield c
        if not old:
            c = CounterMetricFamily("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
                                    labels=_LABELS)
            c.add_metric(lv, float(st.prompt_tokens_cached))
            yield c
            c = CounterMetricFamily("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                    labels=[*_LABELS, "source"])
            c.add_metric([*lv, "local_compute"], float(st.prompt_tokens_computed))
            c.add_metric([*lv, "local_cache_hit"], float(st.prompt_tokens_cached))
            c.add_metric([*lv, "external_kv_transfer"], 0.0)
            yield c

        if not old:
            # vLLM 0.30+ (docs/acceptance-load.md "Metric names"): why requests were refused, corrupted outputs,
            # the KV connector's prefix cache, and the cached blocks' residency.
            rej = CounterMetricFamily("vllm:admission_rejections",
                                      "Number of admission attempts rejected by a queue limit, by reason.",
                                      labels=["model_name", "reason"])
            for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
                rej.add_metric([cfg.model, reason], float(st.admission_rejections.get(reason, 0)))
            yield rej
            for name, doc, value in (
                ("vllm:corrupted_requests", "Corrupted requests, based on NaNs in logits.", st.corrupted_requests),
                ("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector "
                 "cross-instance cache sharing, in terms of number of queried tokens.", 0),
                ("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance "
                 "cache sharing, in terms of number of cached tokens.", 0),
            ):
                c = CounterMetricFamily(name, doc, labels=_LABELS)
                c.add_metric(lv, float(value))
                yield c
            for name, doc, hist in (
                ("vllm:kv_block_lifetime_seconds", "KV cache block lifetime from allocation to eviction (sampled).",
                 kv.lifetime),
                ("vllm:kv_block_idle_before_evict_seconds", "Idle time before eviction (sampled).",
                 kv.idle_before_evict),
                ("vllm:kv_block_reuse_gap_seconds", "Time between consecutive uses of a cached block (sampled).",
                 kv.reuse_gap),
            ):
                yield self._hist(name, doc, hist, lv)

        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=[*_LABELS, "finished_reason"])
        for reason in ("stop", "length", "abort", "tool_calls"):
            success.add_metric([*lv, reason], float(st.success.get(reason, 0)))
        yield success

        yield self._hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         st.ttft, lv)
        itl_name = "vllm:time_per_output_token_seconds" if old else "vllm:inter_token_latency_seconds"
        yield self._hist(itl_name, "Histogram of inter-token latency in seconds.", st.itl, lv)
        yield self._hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                         st.e2e, lv)
        yield self._hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                         st.queue, lv)
        yield self._hist("vllm:request_prefill_time_seconds",
                         "Histogram of time spent in PREFILL phase for request.", st.prefill, lv)

        if not old:
            info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                     labels=["block_size", "enable_prefix_caching", "engine", "mamba_cache_mode",
                                             "num_gpu_blocks", "prefix_cache_retention_interval",
                                             "prefix_match_unit"])
            info.add_metric([str(cfg.block_size), str(cfg.prefix_caching), "0", "align",
                             str(cfg.kv_blocks), "0",
                             str(cfg.prefix_match_unit) if cfg.prefix_match_unit else "None"], 1.0)
            yield info


class _DcgmCollector:
    """The engine's GPUs as dcgm-exporter names them (the whole GPU's series, no MIG instances)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        eng = self.engine
        cfg = eng.cfg
        busy = 0.0 if eng.dead else min(1.0, len(eng.running) / max(cfg.max_num_seqs, 1))
        kv = 0.0 if eng.dead else eng.kv.usage
        used = min(cfg.gpu_memory_mib, cfg.gpu_weights_mib + cfg.gpu_kv_pool_mib * kv
                   + cfg.gpu_activation_mib_per_seq * (0 if eng.dead else len(eng.running)))
        labels = ["gpu", "UUID", "device", "modelName", "Hostname"]
        fams = {name: GaugeMetricFamily(name, doc, labels=labels) for name, doc in (
            ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
            ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."))}
        for i in range(cfg.gpu_count):
            lv = [str(i), f"GPU-sim-{cfg.seed:04d}-{i:04d}", f"nvidia{i}", "simulated", "vllm-sim"]
            fams["DCGM_FI_DEV_FB_FREE"].add_metric(lv, round(cfg.gpu_memory_mib - used))
            fams["DCGM_FI_DEV_FB_USED"].add_metric(lv, round(used))
            fams["DCGM_FI_DEV_POWER_USAGE"].add_metric(
                lv, round(cfg.gpu_power_idle_w + (cfg.gpu_power_max_w - cfg.gpu_power_idle_w) * busy, 3))
            fams["DCGM_FI_DEV_GPU_UTIL"].add_metric(lv, round(100 * busy))
        yield from fams.values()


def render_dcgm(engine: Engine) -> tuple[bytes, str]:
    """The simulated dcgm-exporter page (Prometheus text 0.0.4, as the exporter serves it)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DcgmCollector(engine))  # type: ignore[arg-type]
    return _render_prometheus(registry), PROMETHEUS_CONTENT_TYPE


def render(engine: Engine) -> tuple[bytes, str]:
    """The page and its content type, in the configured exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SimCollector(engine))  # type: ignore[arg-type]
    openmetrics = engine.cfg.metrics_format == "openmetrics"
    render_fn = _render_openmetrics if openmetrics else _render_prometheus
    try:
        # vLLM's names carry a colon; newer prometheus-client escapes names unless told not to.
        body = render_fn(registry, escaping="allow-utf-8")  # type: ignore[operator]
    except TypeError:
        body = render_fn(registry)  # type: ignore[operator]
    return body, OPENMETRICS_CONTENT_TYPE if openmetrics else PROMETHEUS_CONTENT_TYPE
