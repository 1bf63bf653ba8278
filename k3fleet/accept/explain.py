"""The vLLM 0.30+ metrics that explain failures, read over a window between two ``/metrics`` pages.

* ``vllm:admission_rejections{reason}``: requests refused by a queue cap (``max_num_queued_reqs``,
  ``max_num_queued_tokens``), which clients see as 503s; reported by reason.
* ``vllm:corrupted_requests``: requests whose logits held NaN/inf; any in the window is a failure.
* ``vllm:external_prefix_cache_queries|hits``: the KV connector's (offload, LMCache, another instance)
  prefix cache; its hits are reuse too and are said as such, beside the local counters.
* KV block residency (``vllm:kv_block_lifetime_seconds``, ``..._idle_before_evict_seconds``,
  ``..._reuse_gap_seconds``, sampled): when cached blocks are typically evicted sooner than they are
  typically reused, retention does not fit the traffic (the seeds' third cause of lost reuse).

Names and their sources: docs/acceptance-load.md ("Metric names"). A metric the page does not carry
is None, never 0; a window with nothing to say gives no finding.
"""

from __future__ import annotations

from typing import Any

from k3fleet.accept.metrics import MetricsSnapshot, delta
from k3fleet.accept.result import finding
from k3fleet.models.findings import Finding

REJECTIONS = "vllm:admission_rejections"
CORRUPTED = "vllm:corrupted_requests"
EXTERNAL = ("vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits")
RESIDENCY = {"lifetime": "vllm:kv_block_lifetime_seconds",
             "idle_before_evict": "vllm:kv_block_idle_before_evict_seconds",
             "reuse_gap": "vllm:kv_block_reuse_gap_seconds"}


def _rejections(before: MetricsSnapshot, after: MetricsSnapshot, model: str | None) -> dict[str, float] | None:
    if not after.has(REJECTIONS):
        return None
    reasons = {lab.get("reason", "") for name in (REJECTIONS + "_total", REJECTIONS)
               for lab, _ in after.series(name, model)}
    out: dict[str, float] = {}
    for reason in sorted(r for r in reasons if r):
        b = after.counter(REJECTIONS, model, {"reason": reason})
        a = before.counter(REJECTIONS, model, {"reason": reason}) or 0.0
        if b is not None and b >= a:
            out[reason] = b - a
    return out


def window(before: MetricsSnapshot | None, after: MetricsSnapshot | None, model: str | None) -> dict[str, Any]:
    """What the failure-explaining metrics say between two pages (absent metrics as None)."""
    if before is None or after is None:
        return {"read": False}
    out: dict[str, Any] = {"read": True, "admission_rejections": _rejections(before, after, model),
                           "corrupted_requests": delta(before, after, CORRUPTED, model),
                           "external_prefix_cache": {n.split(":")[1]: delta(before, after, n, model)
                                                     for n in EXTERNAL}}
    residency: dict[str, Any] = {}
    for key, name in RESIDENCY.items():
        h_after = after.histogram(name, model)
        h_before = before.histogram(name, model)
        h = h_after.minus(h_before) if h_after is not None and h_before is not None else h_after
        residency[key] = None if h is None else {"count": h.count, "p50_s": h.quantile(0.5)}
    idle, gap = residency.get("idle_before_evict"), residency.get("reuse_gap")
    if idle and gap and idle["count"] and gap["count"] and idle["p50_s"] is not None and gap["p50_s"] is not None:
        residency["evicted_before_reuse"] = idle["p50_s"] < gap["p50_s"]
    out["kv_residency"] = residency
    return out


def findings_of(probe: str, seen: dict[str, Any]) -> list[Finding]:
    """One finding per thing the window explains: corrupted requests fail; rejections, external reuse and a
    retention that does not fit the traffic are said."""
    if not seen.get("read"):
        return []
    out: list[Finding] = []
    corrupted = seen.get("corrupted_requests")
    if corrupted:
        out.append(finding(f"accept.{probe}.corrupted_requests", "error",
                           f"the server counted {corrupted:.0f} corrupted request(s) (vllm:corrupted_requests: NaN or "
                           "inf in the logits) during the run: its answers cannot be trusted", layer="model"))
    rejected = {r: n for r, n in (seen.get("admission_rejections") or {}).items() if n}
    if rejected:
        by = ", ".join(f"{r} {n:.0f}" for r, n in rejected.items())
        out.append(finding(f"accept.{probe}.admission_rejections", "warning",
                           f"the server refused {sum(rejected.values()):.0f} request(s) at admission ({by}): clients "
                           "saw 503s because a queue cap was reached, not because the engine failed", layer="config",
                           evidence=f"vllm:admission_rejections {rejected}"))
    ext = seen.get("external_prefix_cache") or {}
    if ext.get("external_prefix_cache_hits"):
        out.append(finding(f"accept.{probe}.external_prefix_cache", "info",
                           f"{ext['external_prefix_cache_hits']:.0f} prompt tokens came from the external prefix cache "
                           "(KV connector / offload): counted as reuse, from outside this instance's own cache",
                           layer="model", evidence=str(ext)))
    res = seen.get("kv_residency") or {}
    if res.get("evicted_before_reuse"):
        out.append(finding(f"accept.{probe}.retention_short", "warning",
                           f"cached KV blocks are evicted after {res['idle_before_evict']['p50_s']:.1f} s idle "
                           f"(median) but reused after {res['reuse_gap']['p50_s']:.1f} s (median): blocks leave the "
                           "cache before their reuse, retention does not fit the traffic (more KV cache, or fewer "
                           "concurrent "
                           "prefixes)", layer="config", evidence=str(res)))
    return out
