"""The HTTP side of every probe: one endpoint description, one way to call it, one-line errors.

The API key is read from the named environment variable when a client is built and lives only in
that client's headers: it is never a field of the endpoint, so nothing that serialises an
``Endpoint`` (or an ``Exchange``) can carry it into evidence.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from k3fleet.bounds import CAPS, DURATIONS, cap_bytes, loads_json
from k3fleet.contracts import EXIT_INCOMPLETE, EXIT_USAGE
from k3fleet.errors import K3FleetError, UsageError
from k3fleet.evidence.redact import excerpt, remember_secret

# Exit code per error kind: a wrong key or model name is the caller's input (2); an endpoint that
# cannot be reached or answers garbage leaves the evidence incomplete (3).
_KIND_EXIT = {"auth": EXIT_USAGE, "not_found": EXIT_USAGE, "config": EXIT_USAGE}


class EndpointError(K3FleetError):
    """A transport or HTTP failure, already worded as one line."""

    def __init__(self, message: str, *, kind: str = "unreachable", status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status = status
        self.exit_code = _KIND_EXIT.get(kind, EXIT_INCOMPLETE)


class Endpoint(BaseModel):
    """An OpenAI-compatible vLLM endpoint. ``base_url`` is stored without a trailing ``/v1``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str
    model: str = Field(min_length=1)
    api_key_env: str | None = None
    verify_tls: bool = True
    # The deadline of one whole request (connect, headers, body), finite and bounded (k3fleet.bounds).
    timeout_s: float = Field(default=120.0, gt=0, le=DURATIONS["request --timeout"].high, allow_inf_nan=False)

    @field_validator("base_url")
    @classmethod
    def _normalise(cls, value: str) -> str:
        url = value.strip()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL with a host")
        try:
            _ = parts.port
        except ValueError as exc:
            raise ValueError(f"{value!r} has an invalid port") from exc
        if parts.username is not None or parts.password is not None:
            # Credentials on the command line end up in shell history and process lists: keys come from
            # the environment (--api-key-env). The URL is not echoed, it holds the secret.
            raise ValueError("must not carry credentials (user:password@host): put the key in an environment "
                             "variable and pass --api-key-env")
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[: -len("/v1")]
        return urlunsplit((parts.scheme, parts.netloc, path, "", ""))

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and (not value or not value.replace("_", "A").isalnum()):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @property
    def display_url(self) -> str:
        """The base URL with any user-info removed: what evidence and messages may show."""
        parts = urlsplit(self.base_url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def url(self, path: str) -> str:
        return self.base_url + path

    def api_key(self) -> str | None:
        """The key from the environment, at use; a named but unset variable is bad input."""
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise UsageError(f"environment variable {self.api_key_env} (from --api-key-env) is not set or empty")
        # Whatever the variable is called, its value is masked in everything printed or written
        # from now on: a server may echo the key back in an error message (docs/safety.md).
        remember_secret(key)
        return key

    def headers(self) -> dict[str, str]:
        key = self.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0))

    def async_client(self, concurrency: int = 8) -> httpx.AsyncClient:
        """A client with the auth header set and a pool sized for ``concurrency`` requests."""
        limits = httpx.Limits(max_connections=max(1, concurrency), max_keepalive_connections=max(1, concurrency))
        return httpx.AsyncClient(headers=self.headers(), timeout=self.timeout(), limits=limits,
                                 verify=self.verify_tls, follow_redirects=False)


def error_from_exception(exc: Exception, url: str) -> EndpointError:
    """Word a transport failure as one line (the URL without user-info, the cause, what to try)."""
    cause = _root_cause(exc)
    if isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(exc):
        reason = getattr(cause, "verify_message", None) or "certificate verification failed"
        return EndpointError(f"TLS verification failed for {url}: {reason} "
                             "(trust the server's CA, or pass --insecure to turn verification off)", kind="tls")
    if isinstance(cause, ssl.SSLError):
        return EndpointError(f"TLS handshake with {url} failed: {cause.reason or cause}", kind="tls")
    if isinstance(exc, httpx.TimeoutException):
        return EndpointError(f"{url} timed out ({type(exc).__name__})", kind="timeout")
    if isinstance(exc, httpx.ConnectError):
        return EndpointError(f"cannot connect to {url}: {_one_line(str(cause) or str(exc))}", kind="unreachable")
    if isinstance(exc, httpx.RemoteProtocolError):
        return EndpointError(f"{url} closed the connection mid-response: {_one_line(str(exc))}", kind="protocol")
    if isinstance(exc, httpx.HTTPError):
        return EndpointError(f"{url}: {type(exc).__name__}: {_one_line(str(exc))}", kind="protocol")
    return EndpointError(f"{url}: {type(exc).__name__}: {_one_line(str(exc))}", kind="protocol")


def error_from_status(status: int, body: Any, url: str, endpoint: Endpoint | None = None) -> EndpointError:
    """Word an HTTP error status, with the server's own message when its body carries one."""
    detail = _server_message(body)
    tail = f": {detail}" if detail else ""
    if status in (401, 403):
        hint = (f" (check the key in ${endpoint.api_key_env})" if endpoint and endpoint.api_key_env
                else " (the server wants a key: pass --api-key-env VAR)")
        return EndpointError(f"{url} answered {status}{tail}{hint}", kind="auth", status=status)
    if status == 404:
        return EndpointError(f"{url} answered 404{tail}", kind="not_found", status=status)
    if status >= 500:
        return EndpointError(f"{url} answered {status} (server error){tail}", kind="server", status=status)
    return EndpointError(f"{url} answered {status}{tail}", kind="http", status=status)


def _server_message(body: Any) -> str:
    if isinstance(body, Mapping):
        err = body.get("error", body)
        if isinstance(err, Mapping):
            msg = err.get("message") or err.get("detail")
            if isinstance(msg, str):
                return _one_line(msg)
        if isinstance(err, str):
            return _one_line(err)
        if isinstance(body.get("detail"), str):
            return _one_line(body["detail"])
    if isinstance(body, str):
        return excerpt(body, 200, tail="")
    return ""


def _root_cause(exc: BaseException) -> BaseException:
    seen = exc
    while seen.__cause__ is not None or seen.__context__ is not None:
        nxt = seen.__cause__ or seen.__context__
        if nxt is None or nxt is seen:
            break
        seen = nxt
    return seen


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Exchange(BaseModel):
    """One request and what came back, as evidence: bodies, status, timings, the error if any.

    Never holds headers: the Authorization header stays in the client.
    """

    probe: str = ""
    label: str = ""
    method: str = "POST"
    path: str
    request: Any = None
    status: int | None = None
    response: Any = None
    stream: bool = False
    chunks: list[Any] = Field(default_factory=list)
    started_at: float = 0.0
    elapsed_s: float | None = None
    ttft_s: float | None = None
    error: str | None = None
    error_kind: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and 200 <= self.status < 300

    def raise_for_error(self) -> None:
        if self.error is not None:
            raise EndpointError(self.error, kind=self.error_kind or "protocol", status=self.status)


@dataclass
class Body:
    """A response read under its cap and deadline: status, headers and the bytes."""

    status: int
    headers: httpx.Headers
    content: bytes
    charset: str | None = None

    @property
    def text(self) -> str:
        return self.content.decode(self.charset or "utf-8", errors="replace")


def _too_large(shown: str, kind: str, received: int, declared: int | None = None) -> EndpointError:
    cap = CAPS[kind]
    got = f"it announced {declared} bytes" if declared is not None else f"stopped after {received} bytes"
    return EndpointError(f"{shown} answered more than the {cap.limit()}-byte limit for {cap.what} ({got}; "
                         f"{cap.env} raises it)", kind="too_large")


def _deadline(shown: str, deadline_s: float, received: int) -> EndpointError:
    return EndpointError(f"{shown} did not answer in full within {deadline_s:g} s (one deadline for the whole "
                         f"request: connect, headers and body; {received} bytes received)", kind="deadline")


async def _capped_chunks(resp: httpx.Response, shown: str, kind: str, got: list[int]) -> AsyncIterator[bytes]:
    """The body's pieces, stopping with one-line EndpointError past the cap; ``got[0]`` counts."""
    cap = cap_bytes(kind)
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _too_large(shown, kind, 0, int(declared))
    async for piece in resp.aiter_bytes():
        got[0] += len(piece)
        if got[0] > cap:
            raise _too_large(shown, kind, got[0])
        yield piece


async def fetch(client: httpx.AsyncClient, method: str, url: str, *, shown: str, kind: str, deadline_s: float,
                **kwargs: Any) -> Body:
    """One request read whole, at most ``CAPS[kind]`` bytes, all of it (connect, headers, every
    read) within ``deadline_s``: httpx's own timeout bounds each read, a trickling server never
    trips it. Past either limit: one-line EndpointError (exit 3); transport errors are httpx's."""
    got = [0]
    try:
        async with asyncio.timeout(deadline_s):
            async with client.stream(method, url, **kwargs) as resp:
                chunks = [piece async for piece in _capped_chunks(resp, shown, kind, got)]
                return Body(resp.status_code, resp.headers, b"".join(chunks), resp.charset_encoding)
    except TimeoutError as exc:
        raise _deadline(shown, deadline_s, got[0]) from exc


def _decode(resp: Body) -> tuple[Any, str | None]:
    """The JSON body, or the text and why it is not JSON."""
    text = resp.text
    try:
        return loads_json(text), None
    except ValueError:
        return excerpt(text, 4000, tail="", one_line=False), "malformed JSON"


def _per_read(timeout_s: float | None) -> dict[str, Any]:
    return {} if timeout_s is None else {"timeout": httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))}


async def get_json(client: httpx.AsyncClient, endpoint: Endpoint, path: str, *, probe: str = "",
                   label: str = "", kind: str = "models") -> Exchange:
    ex = Exchange(probe=probe, label=label, method="GET", path=path, started_at=time.time())
    return await _round_trip(client, endpoint, ex, kind=kind, deadline_s=endpoint.timeout_s)


async def post_json(client: httpx.AsyncClient, endpoint: Endpoint, path: str, body: Mapping[str, Any], *,
                    probe: str = "", label: str = "", timeout_s: float | None = None,
                    headers: Mapping[str, str] | None = None) -> Exchange:
    """POST a JSON body (non-streaming); transport and HTTP failures land in ``error``, never raised.
    ``timeout_s`` (default: the endpoint's) is the deadline of the whole request."""
    ex = Exchange(probe=probe, label=label, path=path, request=dict(body), started_at=time.time())
    return await _round_trip(client, endpoint, ex, kind="completion", deadline_s=timeout_s or endpoint.timeout_s,
                             content=dumps_body(body), headers={"Content-Type": "application/json", **(headers or {})},
                             **_per_read(timeout_s))


async def _round_trip(client: httpx.AsyncClient, endpoint: Endpoint, ex: Exchange, *, kind: str, deadline_s: float,
                      **fetch_kw: Any) -> Exchange:
    """``ex``'s request, answered: transport and HTTP failures land in its ``error``, never raised."""
    url = endpoint.display_url + ex.path
    t0 = time.perf_counter()
    try:
        resp = await fetch(client, ex.method, endpoint.url(ex.path), shown=url, kind=kind, deadline_s=deadline_s,
                           **fetch_kw)
    except EndpointError as limit:
        ex.error, ex.error_kind, ex.elapsed_s = limit.message, limit.kind, time.perf_counter() - t0
        return ex
    except httpx.HTTPError as exc:
        err = error_from_exception(exc, url)
        ex.error, ex.error_kind, ex.elapsed_s = err.message, err.kind, time.perf_counter() - t0
        return ex
    ex.elapsed_s = time.perf_counter() - t0
    ex.status = resp.status
    ex.response, bad = _decode(resp)
    _judge(ex, endpoint, url, bad)
    return ex


def _judge(ex: Exchange, endpoint: Endpoint, url: str, bad_json: str | None) -> None:
    assert ex.status is not None
    if not 200 <= ex.status < 300:
        err = error_from_status(ex.status, ex.response, url, endpoint)
        ex.error, ex.error_kind = err.message, err.kind
    elif bad_json:
        ex.error, ex.error_kind = f"{url} answered {ex.status} with a body that is not JSON", "bad_response"


def dumps_body(body: Mapping[str, Any]) -> bytes:
    """Byte-stable serialisation: the same body always gives the same bytes (key order as built,
    no whitespace), so a prefix the probes send twice is byte-identical on the wire."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


class StreamedMessage(BaseModel):
    """A streamed chat completion put back together the way a client would."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    done: bool = False
    # Tool-call deltas that did not fit the OpenAI shape (no index, arguments not a string...).
    malformed_deltas: int = 0


def assemble_stream(chunks: list[Any]) -> StreamedMessage:
    """Fold ``chat.completion.chunk`` objects into one message; tool calls keyed by their ``index``."""
    msg = StreamedMessage()
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if chunk == "[DONE]":
            msg.done = True
            continue
        if not isinstance(chunk, Mapping):
            continue
        if isinstance(chunk.get("usage"), Mapping):
            msg.usage = dict(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta, Mapping):
                if isinstance(delta.get("content"), str):
                    msg.content += delta["content"]
                for key in ("reasoning", "reasoning_content"):
                    if isinstance(delta.get(key), str):
                        msg.reasoning += delta[key]
                for tc in delta.get("tool_calls") or []:
                    if not isinstance(tc, Mapping) or not isinstance(tc.get("index"), int):
                        msg.malformed_deltas += 1
                        continue
                    slot = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                          "function": {"name": "", "arguments": ""}})
                    if tc.get("id"):
                        slot["id"] = tc["id"]
                    fn = tc.get("function") or {}
                    if isinstance(fn.get("name"), str):
                        slot["function"]["name"] += fn["name"]
                    args = fn.get("arguments")
                    if isinstance(args, str):
                        slot["function"]["arguments"] += args
                    elif args is not None:
                        msg.malformed_deltas += 1
            if choice.get("finish_reason"):
                msg.finish_reason = choice["finish_reason"]
    msg.tool_calls = [calls[i] for i in sorted(calls)]
    return msg


def _has_token(chunk: Mapping[str, Any]) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        if isinstance(delta, Mapping) and any(delta.get(k) for k in ("content", "reasoning", "reasoning_content",
                                                                      "tool_calls")):
            return True
    return False


async def _lines(pieces: AsyncIterator[bytes], charset: str | None) -> AsyncIterator[str]:
    """Lines of a byte stream (``\n`` or ``\r\n``); the pieces are already capped, so a line
    without an end cannot grow past the cap either."""
    buf = bytearray()
    async for piece in pieces:
        buf += piece
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            yield bytes(buf[start:end]).rstrip(b"\r").decode(charset or "utf-8", errors="replace")
            start = end + 1
        del buf[:start]
    if buf:
        yield bytes(buf).rstrip(b"\r").decode(charset or "utf-8", errors="replace")


def body_lines(resp: httpx.Response, shown: str, kind: str = "completion") -> AsyncIterator[str]:
    """The lines of a streamed answer, at most ``CAPS[kind]`` bytes in all (one-line EndpointError past it)."""
    return _lines(_capped_chunks(resp, shown, kind, [0]), resp.charset_encoding)


async def stream_chat(client: httpx.AsyncClient, endpoint: Endpoint, body: Mapping[str, Any], *,
                      probe: str = "", label: str = "", timeout_s: float | None = None,
                      headers: Mapping[str, str] | None = None) -> Exchange:
    """POST a streaming chat completion; TTFT is the first chunk that carries a token.

    A stream that ends without ``[DONE]`` (cut half-way) is an error, with the chunks kept.
    """
    path = "/v1/chat/completions"
    req = dict(body)
    req["stream"] = True
    ex = Exchange(probe=probe, label=label, path=path, request=req, stream=True, started_at=time.time())
    url = endpoint.display_url + path
    t0 = time.perf_counter()
    deadline_s = timeout_s or endpoint.timeout_s
    got = [0]
    try:
        # One deadline for the whole stream, one cap on its bytes (k3fleet.bounds "completion").
        async with asyncio.timeout(deadline_s):
            async with client.stream("POST", endpoint.url(path), content=dumps_body(req),
                                     headers={"Content-Type": "application/json", **(headers or {})},
                                     **_per_read(timeout_s)) as resp:
                ex.status = resp.status_code
                pieces = _capped_chunks(resp, url, "completion", got)
                if not 200 <= resp.status_code < 300:
                    answer = Body(resp.status_code, resp.headers, b"".join([p async for p in pieces]),
                                  resp.charset_encoding)
                    ex.response, _ = _decode(answer)
                    _judge(ex, endpoint, url, None)
                    ex.elapsed_s = time.perf_counter() - t0
                    return ex
                async for line in _lines(pieces, resp.charset_encoding):
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        ex.chunks.append("[DONE]")
                        break
                    try:
                        chunk = loads_json(payload)
                    except ValueError:
                        ex.chunks.append(excerpt(payload, 2000, tail="", one_line=False))
                        ex.error, ex.error_kind = f"{url} streamed a chunk that is not JSON", "bad_response"
                        continue
                    if ex.ttft_s is None and isinstance(chunk, Mapping) and _has_token(chunk):
                        ex.ttft_s = time.perf_counter() - t0
                    ex.chunks.append(chunk)
    except TimeoutError:
        late = _deadline(url, deadline_s, got[0])
        ex.error, ex.error_kind = late.message, late.kind
    except EndpointError as limit:
        ex.error, ex.error_kind = limit.message, limit.kind
    except httpx.HTTPError as exc:
        failed = error_from_exception(exc, url)
        ex.error, ex.error_kind = failed.message, failed.kind
    ex.elapsed_s = time.perf_counter() - t0
    if ex.error is None and (not ex.chunks or ex.chunks[-1] != "[DONE]"):
        ex.error, ex.error_kind = f"{url}: the stream ended before [DONE] (cut half-way)", "protocol"
    ex.response = assemble_stream(ex.chunks).model_dump()
    return ex


def model_card_from(body: Any, endpoint: Endpoint) -> tuple[list[Any], dict[str, Any]]:
    """(every served id, the endpoint's model card) from a ``/v1/models`` body, or one EndpointError:
    no model list (exit 3), the model not among them (exit 2)."""
    data = body.get("data") if isinstance(body, Mapping) else None
    if not isinstance(data, list):
        raise EndpointError(f"{endpoint.display_url}/v1/models answered without a model list", kind="bad_response")
    ids = [m.get("id") for m in data if isinstance(m, Mapping)]
    if endpoint.model not in ids:
        shown = ", ".join(str(i) for i in ids[:5]) or "none"
        raise EndpointError(f"model {endpoint.model!r} is not served at {endpoint.display_url} (served: {shown})",
                            kind="not_found", status=404)
    card = next(m for m in data if isinstance(m, Mapping) and m.get("id") == endpoint.model)
    return ids, dict(card)


def max_model_len_of(card: Mapping[str, Any]) -> int | None:
    """vLLM's ``max_model_len`` of a model card; None where the server does not say (other servers)."""
    value = card.get("max_model_len")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def model_card(client: httpx.AsyncClient, endpoint: Endpoint) -> dict[str, Any]:
    """The endpoint's model card from ``/v1/models``; every probe checks the model is served with it."""
    ex = await get_json(client, endpoint, "/v1/models")
    ex.raise_for_error()
    return model_card_from(ex.response, endpoint)[1]


async def preflight(client: httpx.AsyncClient, endpoint: Endpoint) -> dict[str, Any]:
    """Reach the server and find the model, or raise one EndpointError: unreachable, TLS, 401, 404."""
    ex = await get_json(client, endpoint, "/v1/models")
    ex.raise_for_error()
    ids, card = model_card_from(ex.response, endpoint)
    info: dict[str, Any] = {"models": ids, "max_model_len": max_model_len_of(card)}
    # vLLM's own /version; other OpenAI-compatible servers may not have it, which is not an error.
    ver = await get_json(client, endpoint, "/version")
    if ver.ok and isinstance(ver.response, Mapping) and isinstance(ver.response.get("version"), str):
        info["vllm_version"] = ver.response["version"]
    return info
