"""One server, one story: what each probe saw of the server, and whether a start-up log is of that server.

``accept startup`` reads who the server is from its log (the version banner, ``non-default args``:
model path, served name, max_model_len, prefix caching, block size, host and port, the parsers); the
live probes read it from the endpoint (``/version``, the model card's ``root`` and ``max_model_len``
on ``/v1/models``, ``vllm:cache_config_info`` and ``process_start_time_seconds`` on ``/metrics``).
:func:`mismatches` holds the two side by side: a log whose server differs from the tested endpoint
is start-up evidence of another server (docs/acceptance.md, "One server, one story").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from k3fleet.accept.client import Endpoint, get_json, max_model_len_of
from k3fleet.accept.metrics import MetricsError, MetricsSnapshot, scrape

# The keys both sides may carry; a key only one side knows is never a mismatch.
KEYS = ("vllm_version", "model_id", "model_root", "max_model_len", "prefix_caching", "block_size", "host", "port")
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def from_startup(data: Mapping[str, Any]) -> dict[str, Any]:
    """The server as the start-up log names it (``accept startup``'s data)."""
    model = data.get("model")
    served = data.get("served_model_name")
    return {"source": "start-up log", "vllm_version": data.get("vllm_version"),
            "model_root": model if isinstance(model, str) else None,
            "model_id": served if isinstance(served, str) else (model if isinstance(model, str) else None),
            "max_model_len": data.get("max_model_len"), "prefix_caching": data.get("prefix_caching"),
            "block_size": data.get("block_size"), "host": data.get("host"), "port": data.get("port"),
            "tool_call_parser": data.get("tool_call_parser"), "reasoning_parser": data.get("reasoning_parser")}


async def live(client: httpx.AsyncClient, endpoint: Endpoint, snap: MetricsSnapshot | None = None) -> dict[str, Any]:
    """The server as its endpoint shows it; fields it does not publish stay None."""
    parts = urlsplit(endpoint.base_url)
    seen: dict[str, Any] = {"source": "endpoint", "model_id": endpoint.model, "host": parts.hostname,
                            "port": parts.port or (443 if parts.scheme == "https" else 80)}
    ver = await get_json(client, endpoint, "/version")
    if ver.ok and isinstance(ver.response, Mapping) and isinstance(ver.response.get("version"), str):
        seen["vllm_version"] = ver.response["version"]
    models = await get_json(client, endpoint, "/v1/models")
    data = models.response.get("data") if models.ok and isinstance(models.response, Mapping) else None
    card = next((m for m in data or [] if isinstance(m, Mapping) and m.get("id") == endpoint.model), None)
    if card is not None:
        seen["model_root"] = card.get("root") if isinstance(card.get("root"), str) else None
        seen["max_model_len"] = max_model_len_of(card)
    if snap is None:
        try:
            snap = await scrape(client, endpoint.base_url)
        except MetricsError as exc:
            seen["metrics_error"] = str(exc)
    if snap is not None:
        cfg = snap.cache_config() or {}
        seen["cache_config"] = cfg or None
        seen["prefix_caching"] = snap.prefix_caching_enabled()
        block = cfg.get("block_size", "")
        seen["block_size"] = int(block) if block.strip().isdigit() else None
        seen["process_start_time"] = snap.process_start_time()
    return seen


def mismatches(log: Mapping[str, Any], endpoint: Mapping[str, Any]) -> list[str]:
    """Each way the start-up log's server differs from the endpoint's, as one phrase; [] when they agree
    on everything both know. The port counts only when the log's server listened on the host the probes
    called (a proxy or a published port in between changes the port, not the server)."""
    out = []
    for key in KEYS:
        a, b = log.get(key), endpoint.get(key)
        if a is None or b is None or key == "host":
            continue
        if key == "port" and not _same_host(log.get("host"), endpoint.get("host")):
            continue
        if str(a) != str(b):
            out.append(f"{key}: log {a}, endpoint {b}")
    return out


def _same_host(log_host: Any, ep_host: Any) -> bool:
    if not isinstance(log_host, str) or not isinstance(ep_host, str):
        return False
    return log_host == ep_host or (log_host in _LOOPBACK and ep_host in _LOOPBACK)
