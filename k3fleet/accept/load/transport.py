"""The load run's HTTP side: one aiohttp session for the streamed chat completions, /v1/models, /health
and /metrics, and the reading of a stream into a :class:`Shot`.

aiohttp at a thousand concurrent streams costs about a fifth of httpx's CPU per request here
(docs/acceptance-load.md, "Client"), and the load generator must not be the bottleneck it measures.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from k3fleet.accept.client import Endpoint, EndpointError, error_from_status, max_model_len_of, model_card_from
from k3fleet.accept.load.options import LoadOptions
from k3fleet.accept.load.shots import Shot, one_line
from k3fleet.accept.metrics import SCRAPE_ACCEPT, MetricsError, MetricsSnapshot, metrics_url, parse_metrics
from k3fleet.bounds import cap_bytes, limit_hint, loads_json

_CONTEXT = re.compile(r"maximum context length|context length|too long|max_model_len", re.IGNORECASE)


class Transport:
    """The session every request of a run goes through; ``t0`` is the run's start (shots' ``t``)."""

    def __init__(self, endpoint: Endpoint, opts: LoadOptions, concurrency: int, t0: float) -> None:
        self.ep = endpoint
        self.opts = opts
        self.t0 = t0
        self.url = endpoint.url("/v1/chat/completions")
        # verify_tls False is the operator's explicit --insecure; True keeps aiohttp's default checks.
        ssl_ctx: ssl.SSLContext | bool = bool(endpoint.verify_tls)
        conn = aiohttp.TCPConnector(limit=max(concurrency, 1) + 4, ssl=ssl_ctx, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=opts.request_timeout_s, sock_connect=min(10.0, opts.request_timeout_s))
        self.session = aiohttp.ClientSession(connector=conn, timeout=timeout, headers=endpoint.headers())

    async def close(self) -> None:
        await self.session.close()

    async def send(self, body: dict[str, Any], shot: Shot, *, parse_all: bool) -> Shot:
        """POST one streaming chat completion; fills ``shot`` with timings, usage and errors."""
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        t0 = time.perf_counter()
        shot.t = time.monotonic() - self.t0
        calls: dict[int, dict[str, Any]] = {}
        content: list[str] = []
        try:
            return await self._stream(data, shot, parse_all, t0, calls, content)
        finally:
            # A failed attempt keeps the tool calls it streamed: a retry that streams them again runs them twice.
            if calls and not shot.tool_calls:
                shot.tool_calls = [calls[i] for i in sorted(calls)]

    async def _stream(self, data: bytes, shot: Shot, parse_all: bool, t0: float, calls: dict[int, dict[str, Any]],
                      content: list[str]) -> Shot:
        last: float | None = None
        done = False
        try:
            async with self.session.post(self.url, data=data, headers={"Content-Type": "application/json"}) as resp:
                shot.status = resp.status
                if resp.status != 200:
                    text = (await resp.content.read(4000)).decode("utf-8", "replace")
                    shot.kind, shot.message = _classify_status(resp.status, text, self.ep)
                    return shot
                async for raw in resp.content:
                    if not raw.startswith(b"data:"):
                        continue
                    payload = raw[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    now = time.perf_counter()
                    shot.chunks += 1
                    if parse_all or shot.ttft is None or _needs_parse(payload):
                        try:
                            obj = loads_json(payload)
                        except ValueError:
                            shot.kind, shot.message = "bad_response", "a streamed chunk is not JSON"
                            return shot
                        if not isinstance(obj, dict):
                            continue
                        if shot.rid is None and isinstance(obj.get("id"), str):
                            shot.rid = obj["id"][:80]
                        if obj.get("error") or obj.get("object") == "error":
                            err = obj.get("error") if isinstance(obj.get("error"), dict) else obj
                            shot.kind = "stream_error"
                            shot.message = one_line(str(err.get("message") if isinstance(err, dict) else err))
                            return shot
                        usage = obj.get("usage")
                        if isinstance(usage, dict):
                            _take_usage(shot, usage)
                        token = _delta_token(obj, content if parse_all else None, calls if parse_all else None)
                    else:
                        token = True
                    if token:
                        if shot.ttft is None:
                            shot.ttft = now - t0
                        elif last is not None:
                            shot.gaps.append(now - last)
                        last = now
        except TimeoutError:
            shot.kind, shot.message = "timeout", f"no complete answer within {self.opts.request_timeout_s:g} s"
            return shot
        except aiohttp.ClientConnectorError as exc:
            shot.kind, shot.message = "connect", one_line(f"cannot connect: {exc.os_error or exc}")
            return shot
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            shot.kind, shot.message = "stream_cut", one_line(f"connection closed mid-response: {exc}")
            return shot
        except aiohttp.ClientError as exc:
            shot.kind, shot.message = "bad_response", one_line(f"{type(exc).__name__}: {exc}")
            return shot
        except ValueError as exc:  # a line longer than the stream reader's limit
            shot.kind, shot.message = "bad_response", one_line(str(exc))
            return shot
        shot.e2e = time.perf_counter() - t0
        if not done:
            shot.kind, shot.message = "stream_cut", "the stream ended before [DONE]"
            return shot
        if shot.ttft is None:
            shot.kind, shot.message = "bad_response", "the stream carried no token"
            return shot
        if shot.completion_tokens is None:
            shot.completion_tokens = len(shot.gaps) + 1
        shot.content = "".join(content)
        shot.tool_calls = [calls[i] for i in sorted(calls)]
        shot.ok = True
        return shot

    async def max_model_len(self) -> int | None:
        """The model must be in /v1/models (exit 2 otherwise), as for every probe; its max_model_len is
        returned."""
        url = self.ep.display_url + "/v1/models"
        try:
            async with self.session.get(self.ep.url("/v1/models"), timeout=aiohttp.ClientTimeout(total=30)) as r:
                raw = await r.content.read(cap_bytes("models") + 1)
                status = r.status
        except aiohttp.ClientConnectorError as exc:
            raise EndpointError(f"cannot connect to {url}: {one_line(str(exc.os_error or exc))}",
                                kind="unreachable") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EndpointError(f"{url}: {one_line(f'{type(exc).__name__}: {exc}')}", kind="unreachable") from exc
        try:
            body: Any = loads_json(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        if status != 200:
            raise error_from_status(status, body, url, self.ep)
        _, card = model_card_from(body, self.ep)
        return max_model_len_of(card)

    async def health(self) -> int | str:
        """/health's status, or one line saying why it could not be read."""
        try:
            async with self.session.get(self.ep.url("/health"), timeout=aiohttp.ClientTimeout(total=5)) as r:
                await r.read()
                return r.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return one_line(f"{type(exc).__name__}: {exc}", 120)

    async def metrics(self, url: str | None = None) -> MetricsSnapshot:
        """One /metrics page (the server's, or ``url``'s: a DCGM exporter), read up to the metrics cap
        (k3fleet.bounds) in pieces, never the whole page first; :class:`MetricsError` (one line) when it cannot
        be read."""
        try:
            async with self.session.get(url or metrics_url(self.ep.base_url), headers={"Accept": SCRAPE_ACCEPT},
                                        timeout=aiohttp.ClientTimeout(total=10)) as r:
                cap, page = cap_bytes("metrics"), bytearray()
                async for piece in r.content.iter_chunked(1 << 16):
                    page += piece
                    if len(page) > cap:
                        raise MetricsError(f"/metrics answered more than {cap} bytes ({limit_hint('metrics')})")
                text = page.decode(r.get_encoding() if r.charset else "utf-8", errors="replace")
                if r.status != 200:
                    raise MetricsError(f"/metrics answered {r.status}")
                return parse_metrics(text, r.headers.get("Content-Type"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise MetricsError(one_line(f"/metrics unreachable: {type(exc).__name__}: {exc}")) from exc


def _needs_parse(payload: bytes) -> bool:
    """Chunks that carry more than a token: usage, an error, or the finish reason."""
    if b'"usage"' in payload or b'"error"' in payload:
        return True
    return b"finish_reason" in payload and b'"finish_reason":null' not in payload and \
        b'"finish_reason": null' not in payload


def _take_usage(shot: Shot, usage: Mapping[str, Any]) -> None:
    if isinstance(usage.get("prompt_tokens"), int):
        shot.prompt_tokens = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        shot.completion_tokens = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, Mapping) and isinstance(details.get("cached_tokens"), int):
        shot.cached_tokens = details["cached_tokens"]


def _delta_token(obj: Mapping[str, Any], content: list[str] | None, calls: dict[int, dict[str, Any]] | None) -> bool:
    token = False
    for choice in obj.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        if not isinstance(delta, Mapping):
            continue
        for key in ("content", "reasoning", "reasoning_content"):
            if delta.get(key):
                token = True
                if key == "content" and content is not None:
                    content.append(str(delta[key]))
        for tc in delta.get("tool_calls") or []:
            token = True
            if calls is None or not isinstance(tc, Mapping):
                continue
            raw_idx = tc.get("index")
            idx = raw_idx if isinstance(raw_idx, int) else len(calls)
            slot = calls.setdefault(idx, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            if tc.get("id"):
                slot["id"] = tc["id"]
            fn_raw = tc.get("function")
            fn: Mapping[str, Any] = fn_raw if isinstance(fn_raw, Mapping) else {}
            if isinstance(fn.get("name"), str):
                slot["function"]["name"] += fn["name"]
            if isinstance(fn.get("arguments"), str):
                slot["function"]["arguments"] += fn["arguments"]
    return token


def _classify_status(status: int, text: str, endpoint: Endpoint) -> tuple[str, str]:
    try:
        body: Any = loads_json(text)
    except ValueError:
        body = text
    message = error_from_status(status, body, endpoint.display_url + "/v1/chat/completions", endpoint).message
    if status == 400 and _CONTEXT.search(text):
        return "context_length", message
    if status in (401, 403):
        return "auth", message
    if status == 404:
        return "not_found", message
    if status >= 500:
        return "http_5xx", message
    return "http_4xx", message


def endpoint_kind(shot: Shot) -> str:
    """The EndpointError kind of a first request that failed."""
    return {"auth": "auth", "not_found": "not_found", "connect": "unreachable", "timeout": "timeout",
            "http_5xx": "server"}.get(shot.kind or "", "bad_response")
