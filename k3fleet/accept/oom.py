"""OOM records of a load run: what a reviewer needs to tell a capacity OOM from a topology one.

An OOM answer (a request failed with "out of memory" / OOM in its message) becomes one record with
the node (the endpoint's host), the engine (vLLM's ``engine`` label: the DP rank whose KV cache was
fullest in the sample before the failure), the error answers around it (redacted before they are
cut), the last successful request before it (time and response id), and memory before and after:
KV usage overall and per engine from the samples on either side. GPU memory is not on vLLM's ``/metrics``:
with a telemetry source (a DCGM exporter, ``telemetry_url``) each sample carries every GPU's memory, power
and utilisation, and the record keeps the GPU curve of its phase up to the failure with the request's shape
and the concurrency at that moment; without one the record says so rather than guess.

Uneven pressure across engines, one engine near full while another has room, is a topology OOM
(docs/acceptance-load.md "OOM records"): more capacity does not fix it, the placement does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from k3fleet.evidence.redact import excerpt

OOM = re.compile(r"out of memory|\bOOM\b", re.IGNORECASE)
# One engine this much fuller than the emptiest one, and near full itself: pressure is uneven.
TOPOLOGY_SPREAD = 0.3
NEAR_FULL = 0.9
MAX_RECORDS = 8
_AROUND = 2
# The GPU curve an OOM record keeps: the samples of its phase up to the failure, the last this many.
CURVE_POINTS = 120
NO_TELEMETRY = "no GPU telemetry source (telemetry_url): the audit's GPU facts of the node hold its memory"


def engine_kv(snap: Any, model: str | None) -> dict[str, float]:
    """KV-cache usage per ``engine`` label of one /metrics page (empty when the page has no engine label)."""
    out: dict[str, float] = {}
    for labels, value in snap.series("vllm:kv_cache_usage_perc", model):
        engine = labels.get("engine")
        if engine is not None and value == value:  # NaN is unknown, not a usage
            out[str(engine)] = max(value, out.get(str(engine), 0.0))
    return out


def uneven(kv_by_engine: Mapping[str, float]) -> bool:
    """True when one engine is near full while another is well below it."""
    if len(kv_by_engine) < 2:
        return False
    hi, lo = max(kv_by_engine.values()), min(kv_by_engine.values())
    return hi >= NEAR_FULL and hi - lo >= TOPOLOGY_SPREAD


def _node(base_url: str | None) -> str | None:
    if not base_url:
        return None
    try:
        return urlsplit(base_url).hostname
    except ValueError:
        return None


def _memory(sample: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if sample is None:
        return None
    return {"t_s": sample.get("t_s"), "kv_usage": sample.get("kv_usage"),
            "kv_by_engine": dict(sample.get("kv_by_engine") or {}), "running": sample.get("running"),
            "waiting": sample.get("waiting"),
            "gpu_memory": {k: {"used_mib": v.get("used_mib"), "free_mib": v.get("free_mib")}
                           for k, v in sample["gpus"].items()} if isinstance(sample.get("gpus"), Mapping) else None}


def gpu_curve(samples: Sequence[Mapping[str, Any]], phase: str, t: float) -> list[dict[str, Any]]:
    """The GPU readings of ``phase``'s samples up to ``t`` (run seconds), with the queue beside them."""
    rows = [{"t_s": s.get("t_s"), "step": s.get("step"), "concurrency": s.get("concurrency"),
             "running": s.get("running"), "waiting": s.get("waiting"), "kv_usage": s.get("kv_usage"),
             "gpus": dict(s["gpus"])}
            for s in samples if isinstance(s.get("gpus"), Mapping) and s.get("phase") == phase
            and isinstance(s.get("t_s"), int | float) and s["t_s"] <= t]
    return rows[-CURVE_POINTS:]


def oom_records(shots: Sequence[Any], samples: Sequence[Mapping[str, Any]], base_url: str | None
                ) -> list[dict[str, Any]]:
    """One record per OOM answer (the first :data:`MAX_RECORDS`), oldest first. ``shots`` are the load
    probe's requests (``t`` start, ``e2e``, ``ok``, ``kind``, ``message``, ``rid``), ``samples`` its
    /metrics samples (``t_s``, ``kv_usage``, ``kv_by_engine``...)."""
    ordered = sorted(shots, key=lambda s: s.t)
    failed = [s for s in ordered if not s.ok and s.message and OOM.search(s.message)]
    out: list[dict[str, Any]] = []
    node = _node(base_url)
    for shot in failed[:MAX_RECORDS]:
        before = [p for p in samples if isinstance(p.get("t_s"), int | float) and p["t_s"] <= shot.t]
        after = [p for p in samples if isinstance(p.get("t_s"), int | float) and p["t_s"] > shot.t]
        mem_before = _memory(before[-1] if before else None)
        mem_after = _memory(after[0] if after else None)
        by_engine = (mem_before or {}).get("kv_by_engine") or {}
        engine = max(by_engine, key=lambda e: by_engine[e]) if by_engine else None
        done = [s for s in ordered if s.ok and s.e2e is not None and s.t + s.e2e <= shot.t + (shot.e2e or 0.0)]
        last_ok = max(done, key=lambda s: s.t + s.e2e, default=None)
        errors = [s for s in ordered if not s.ok and s.message]
        i = errors.index(shot)
        around = [f"[{s.t:.3f}s] {s.kind or 'error'}: {excerpt(s.message, 240, tail='...')}"
                  for s in errors[max(0, i - _AROUND):i + _AROUND + 1]]
        out.append({
            "t_s": round(shot.t, 3), "phase": shot.phase, "step": shot.step, "concurrency": shot.concurrency,
            "context_tokens": shot.context_tokens, "node": node, "engine": engine,
            "message": excerpt(shot.message, 400, tail="..."), "excerpt": around,
            "last_success": None if last_ok is None else {"t_s": round(last_ok.t + last_ok.e2e, 3),
                                                          "id": last_ok.rid},
            "memory_before": mem_before, "memory_after": mem_after,
            "request": {"prompt_tokens": shot.prompt_tokens, "context_tokens": shot.context_tokens,
                        "completion_tokens": shot.completion_tokens},
            "gpu_memory": (mem_before or {}).get("gpu_memory") or NO_TELEMETRY,
            "gpu_curve": gpu_curve(samples, shot.phase, shot.t),
            "topology": uneven(by_engine),
        })
    return out


__all__ = ["NO_TELEMETRY", "OOM", "engine_kv", "gpu_curve", "oom_records", "uneven"]
