"""Read a vLLM ``/metrics`` page: Prometheus text 0.0.4 or OpenMetrics 1.0, current and removed names.

Parsing is prometheus-client's (the reference implementation of both formats); this module only
indexes the samples and answers the questions the probes ask. The rules it follows, with their
sources, are in docs/acceptance-load.md ("Metric names"):

* vLLM's Python server speaks Prometheus text 0.0.4; its Rust frontend speaks only OpenMetrics 1.0,
  where a counter's ``# TYPE`` line carries the base name and its samples carry ``_total``. Samples
  are indexed by the name they carry on the wire, so both formats answer the same way.
* Every series carries ``model_name`` and, on V1 engines, ``engine`` (one per data-parallel rank):
  counters and count-like gauges are summed over engines; ``*_perc`` gauges take the fullest engine.
* A metric that is not on the page is ``None``, never 0. A server exposing only the removed names
  (``gpu_cache_usage_perc``, ``gpu_prefix_cache_*``...) is an old server, reported as such; its old
  series are never read in place of the new ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Literal

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families as _parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as _parse_prometheus
from pydantic import BaseModel, Field

from k3fleet.accept.client import EndpointError, fetch
from k3fleet.errors import IncompleteError
from k3fleet.evidence.redact import excerpt

OPENMETRICS_TYPE = "application/openmetrics-text"
PROMETHEUS_TYPE = "text/plain"
# What Prometheus itself sends when it scrapes: OpenMetrics preferred, 0.0.4 accepted.
SCRAPE_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")

# Names removed from vLLM (deprecated 0.9.2-0.10, hidden 0.11, removed 0.12; time_per_output_token
# removed 0.13), each with the name that replaced it where there is one (docs/acceptance-load.md).
REMOVED_NAMES: dict[str, str | None] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_hit_rate": "vllm:prefix_cache_hits",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
    "vllm:prompt_tokens_recomputed": None,
}
# Present on every V1 server that has the current names; their absence next to old names is "old".
_CURRENT_MARKERS = ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries", "vllm:inter_token_latency_seconds")
_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count", "_gsum", "_gcount", "_info")

Aggregate = Literal["sum", "max", "mean"]


class MetricsError(IncompleteError):
    """The page could not be read or is not Prometheus / OpenMetrics text (exit 3: evidence incomplete)."""


class Histogram(BaseModel):
    """A histogram summed over engines: cumulative bucket counts by upper bound, sum and count."""

    buckets: list[tuple[float, float]] = Field(default_factory=list)
    sum: float | None = None
    count: float | None = None

    def quantile(self, q: float) -> float | None:
        """Estimate quantile ``q`` (0..1) by linear interpolation inside the bucket, as PromQL's
        ``histogram_quantile`` does; ``None`` with no observations."""
        if not self.buckets:
            return None
        total = self.buckets[-1][1]
        if total <= 0:
            return None
        rank = q * total
        prev_le, prev_count = 0.0, 0.0
        for le, count in self.buckets:
            if count >= rank:
                if math.isinf(le):
                    return prev_le
                if count == prev_count:
                    return le
                return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
            prev_le, prev_count = le, count
        return prev_le

    def minus(self, before: Histogram) -> Histogram | None:
        """Observations between two scrapes; ``None`` when the server restarted in between."""
        old = dict(before.buckets)
        out: list[tuple[float, float]] = []
        for le, count in self.buckets:
            diff = count - old.get(le, 0.0)
            if diff < 0:
                return None
            out.append((le, diff))
        s = None if self.sum is None or before.sum is None else self.sum - before.sum
        c = None if self.count is None or before.count is None else self.count - before.count
        if c is not None and c < 0:
            return None
        return Histogram(buckets=out, sum=s, count=c)


_Sample = tuple[dict[str, str], float]


def _base(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def _family_of(sample_name: str) -> str:
    for suffix in _SUFFIXES:
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name


class MetricsSnapshot:
    """One parsed ``/metrics`` page. Every reader returns ``None`` when the metric is absent."""

    def __init__(self, samples: Mapping[str, list[_Sample]], types: Mapping[str, str], raw: str,
                 content_type: str | None, exposition: str) -> None:
        self._samples = {k: list(v) for k, v in samples.items()}
        self._types = dict(types)
        self.raw = raw
        self.content_type = content_type
        # "openmetrics" or "prometheus": which grammar the page parsed with.
        self.exposition = exposition

    # -- the index -------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every sample name on the page (as on the wire: ``_total``, ``_bucket``... included)."""
        return sorted(self._samples)

    def families(self) -> set[str]:
        """Metric family names, suffixes stripped (``vllm:prompt_tokens``, ``vllm:kv_cache_usage_perc``)."""
        return {_family_of(n) for n in self._samples} | set(self._types)

    def has(self, name: str) -> bool:
        """Whether a metric of this name (with or without ``_total``) is on the page."""
        base = _base(name)
        return base in self.families() or any(n in self._samples for n in (name, base + "_total"))

    def models(self) -> list[str]:
        """The ``model_name`` label values seen on vLLM series."""
        return sorted({labels["model_name"] for name, rows in self._samples.items() if name.startswith("vllm:")
                       for labels, _ in rows if "model_name" in labels})

    def series(self, sample_name: str, model: str | None = None,
               labels: Mapping[str, str] | None = None) -> list[_Sample]:
        """Samples of one wire name, filtered by ``model_name`` and any other labels."""
        out = []
        for lab, value in self._samples.get(sample_name, []):
            if model is not None and lab.get("model_name", model) != model:
                continue
            if labels and any(lab.get(k) != v for k, v in labels.items()):
                continue
            out.append((lab, value))
        return out

    # -- readers ---------------------------------------------------------------------------------
    def counter(self, name: str, model: str | None = None, labels: Mapping[str, str] | None = None) -> float | None:
        """A counter summed over engines (and over any label not filtered); ``name`` with or without
        ``_total``. Exposition without ``_total`` (untyped pages) is read too."""
        base = _base(name)
        for wire in (base + "_total", base):
            rows = self.series(wire, model, labels)
            if rows:
                return _finite_sum(v for _, v in rows)
        return None

    def gauge(self, name: str, model: str | None = None, labels: Mapping[str, str] | None = None,
              agg: Aggregate | None = None) -> float | None:
        """A gauge over engines: summed (running, waiting...), or for ``*_perc`` fractions the
        fullest engine (a mean would hide one engine at its limit). ``agg`` overrides."""
        rows = self.series(name, model, labels)
        values = [v for _, v in rows if not math.isnan(v)]
        if not values:
            return None
        how = agg or ("max" if name.endswith("_perc") else "sum")
        if how == "max":
            return max(values)
        if how == "mean":
            return sum(values) / len(values)
        return sum(values)

    def histogram(self, name: str, model: str | None = None,
                  labels: Mapping[str, str] | None = None) -> Histogram | None:
        """A histogram with buckets summed per bound over engines; ``None`` if the page has none."""
        buckets: dict[float, float] = {}
        for lab, value in self.series(name + "_bucket", model, labels):
            try:
                le = float(lab.get("le", "nan"))
            except ValueError:
                continue
            if not math.isnan(le):
                buckets[le] = buckets.get(le, 0.0) + value
        sums = self.series(name + "_sum", model, labels)
        counts = self.series(name + "_count", model, labels)
        if not buckets and not sums and not counts:
            return None
        return Histogram(buckets=sorted(buckets.items()),
                         sum=_finite_sum(v for _, v in sums) if sums else None,
                         count=_finite_sum(v for _, v in counts) if counts else None)

    def cache_config(self) -> dict[str, str] | None:
        """The labels of ``vllm:cache_config_info`` (every cache setting as a string), the first
        engine's when there are several; ``None`` when the server does not publish it."""
        rows = self._samples.get("vllm:cache_config_info", [])
        if not rows:
            return None
        return {k: v for k, v in rows[0][0].items() if k not in ("engine", "model_name")}

    def prefix_caching_enabled(self) -> bool | None:
        """``enable_prefix_caching`` from ``cache_config_info``: True, False, or None when unknown."""
        cfg = self.cache_config()
        value = (cfg or {}).get("enable_prefix_caching")
        if value is None:
            return None
        return value.strip().lower() == "true"

    def old_names(self) -> list[str]:
        """Removed vLLM names present on the page (family names, without suffixes)."""
        fams = self.families()
        return sorted(n for n in REMOVED_NAMES if n in fams)

    @property
    def is_old_server(self) -> bool:
        """Only removed names, none of their replacements: a pre-0.12 server whose metrics the
        probes cannot read as current ones."""
        fams = self.families()
        return bool(self.old_names()) and not any(m in fams for m in _CURRENT_MARKERS)

    @property
    def has_vllm(self) -> bool:
        return any(n.startswith("vllm:") for n in self._samples)

    def process_start_time(self) -> float | None:
        """``process_start_time_seconds`` (prometheus-client's process collector), when published."""
        return self.gauge("process_start_time_seconds", agg="max")

    # -- windows ---------------------------------------------------------------------------------
    @staticmethod
    def delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str, model: str | None = None) -> float | None:
        return delta(before, after, name, model)

    def summary(self, model: str | None = None) -> dict[str, float | None]:
        """The load-relevant values in one flat dict (what the load probe samples through a run)."""
        return {
            "running": self.gauge("vllm:num_requests_running", model),
            "waiting": self.gauge("vllm:num_requests_waiting", model),
            "kv_usage": self.gauge("vllm:kv_cache_usage_perc", model),
            "preemptions": self.counter("vllm:num_preemptions", model),
            "prompt_tokens": self.counter("vllm:prompt_tokens", model),
            "generation_tokens": self.counter("vllm:generation_tokens", model),
            "prefix_cache_queries": self.counter("vllm:prefix_cache_queries", model),
            "prefix_cache_hits": self.counter("vllm:prefix_cache_hits", model),
            "prompt_tokens_cached": self.counter("vllm:prompt_tokens_cached", model),
        }


def delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str, model: str | None = None) -> float | None:
    """How much a counter rose between two snapshots. ``None`` when either side lacks it, or when it
    went down (the server restarted in between: the window's count is unknown, not negative)."""
    a = before.counter(name, model)
    b = after.counter(name, model)
    if a is None or b is None or b < a:
        return None
    return b - a


def _finite_sum(values: Iterable[float]) -> float:
    return float(sum(v for v in values if not math.isnan(v)))


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def _index(families: Iterable[object]) -> tuple[dict[str, list[_Sample]], dict[str, str]]:
    samples: dict[str, list[_Sample]] = {}
    types: dict[str, str] = {}
    for fam in families:
        name, ftype = getattr(fam, "name"), getattr(fam, "type")  # noqa: B009 - prometheus-client's Metric
        if ftype != "unknown":
            types[name] = ftype
        for s in getattr(fam, "samples"):  # noqa: B009
            samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return samples, types


def parse_metrics(text: str, content_type: str | None = None) -> MetricsSnapshot:
    """Parse a ``/metrics`` page. The declared content type picks the grammar; without one, a page
    ending in ``# EOF`` is OpenMetrics. A page neither grammar accepts raises :class:`MetricsError`."""
    media = _media_type(content_type)
    stripped = text.rstrip()
    looks_om = stripped.endswith("# EOF")
    if media == OPENMETRICS_TYPE or (not media and looks_om) or (media == PROMETHEUS_TYPE and looks_om):
        order = ("openmetrics", "prometheus")
    else:
        order = ("prometheus", "openmetrics")
    if media in ("application/json", "text/html"):
        raise MetricsError(f"/metrics answered {media}, not Prometheus or OpenMetrics text")
    errors: list[str] = []
    for grammar in order:
        try:
            if grammar == "openmetrics":
                fams = list(_parse_openmetrics(text if looks_om else text.rstrip("\n") + "\n# EOF\n"))
            else:
                fams = list(_parse_prometheus(text))
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            errors.append(f"{grammar}: {excerpt(exc, 160, tail='')}")
            continue
        samples, types = _index(fams)
        return MetricsSnapshot(samples, types, text, content_type, grammar)
    raise MetricsError("/metrics is not Prometheus or OpenMetrics text (" + "; ".join(errors) + ")")


def metrics_url(base_url: str) -> str:
    """``/metrics`` lives at the server root, beside ``/v1``."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/metrics"


async def scrape(client: httpx.AsyncClient, base_url: str, *, timeout_s: float | None = None) -> MetricsSnapshot:
    """GET ``/metrics`` and parse it; transport errors, non-200 answers, garbage, a page past its
    cap and a scrape past its deadline (``timeout_s``, default the client's, for the whole
    request) raise one-line :class:`MetricsError`."""
    return await scrape_url(client, metrics_url(base_url), timeout_s=timeout_s)


async def scrape_url(client: httpx.AsyncClient, url: str, *, timeout_s: float | None = None) -> MetricsSnapshot:
    """:func:`scrape` of a page at ``url`` itself (a DCGM exporter's ``/metrics``)."""
    deadline_s = timeout_s if timeout_s is not None else (client.timeout.read or 120.0)
    kwargs: dict[str, object] = {}
    if timeout_s is not None:
        kwargs["timeout"] = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
    try:
        resp = await fetch(client, "GET", url, shown=_shown(url), kind="metrics", deadline_s=deadline_s,
                           headers={"Accept": SCRAPE_ACCEPT}, **kwargs)
    except EndpointError as exc:
        raise MetricsError(exc.message) from exc
    except httpx.TimeoutException as exc:
        raise MetricsError(f"{_shown(url)} timed out ({type(exc).__name__})") from exc
    except httpx.HTTPError as exc:
        raise MetricsError(f"cannot read {_shown(url)}: {' '.join(str(exc).split()) or type(exc).__name__}") from exc
    if resp.status != 200:
        raise MetricsError(f"{_shown(url)} answered {resp.status}")
    return parse_metrics(resp.text, resp.headers.get("content-type"))


def _shown(url: str) -> str:
    """The URL without user-info, as messages and evidence may show it."""
    parts = httpx.URL(url)
    return str(parts.copy_with(username=None, password=None)) if parts.userinfo else url
