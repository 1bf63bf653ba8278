"""The simulator's HTTP server (aiohttp): vLLM's OpenAI-compatible routes over the simulated engine.

Routes: ``GET /health``, ``GET /version``, ``GET /v1/models``, ``POST /v1/chat/completions`` (stream
and not), ``GET /metrics``. With ``api_key_env`` set, ``/v1/*`` answers 401 without the bearer key,
as vLLM's ``--api-key`` does; ``/health`` and ``/metrics`` stay open. Error bodies and the context
length message follow vLLM's wording.

aiohttp is used because the simulator must stream thousands of server-sent-event responses at
once from one event loop, shut down cleanly in tests, and bind a free port: its web server does
all three with no extra process or thread per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections import deque
from types import TracebackType
from typing import Any

from aiohttp import web

from k3fleet.lab.vllm_sim import exposition, tokenizer
from k3fleet.lab.vllm_sim.config import SimConfig
from k3fleet.lab.vllm_sim.engine import Engine, EngineDead, QueueFull, SimRequest
from k3fleet.lab.vllm_sim.generate import Plan, RequestError, extend_to, plan_answer, render_prompt

_ENGINE = web.AppKey("engine", Engine)


def _j(obj: Any) -> str:
    # Compact, as vLLM's pydantic serialisation writes it.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


_CFG = web.AppKey("cfg", SimConfig)
_RNG = web.AppKey("rng", random.Random)


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


@web.middleware
async def _auth(request: web.Request, handler: Any) -> web.StreamResponse:
    cfg = request.app[_CFG]
    if cfg.api_key_env and request.path.startswith("/v1"):
        key = os.environ.get(cfg.api_key_env, "")
        if not key or request.headers.get("Authorization", "") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
    resp: web.StreamResponse = await handler(request)
    return resp


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=503 if request.app[_ENGINE].dead else 200)


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": request.app[_CFG].vllm_version})


async def _models(request: web.Request) -> web.Response:
    cfg = request.app[_CFG]
    eng = request.app[_ENGINE]
    return web.json_response({"object": "list", "data": [{
        "id": cfg.model, "object": "model", "created": int(eng.started_at), "owned_by": "vllm",
        "root": cfg.model, "parent": None, "max_model_len": cfg.effective_max_model_len}]})


async def _metrics(request: web.Request) -> web.Response:
    lag = request.app[_CFG].metrics_lag_s
    if lag <= 0:
        body, ctype = exposition.render(request.app[_ENGINE])
    else:
        body, ctype = request.app[_PAGES].as_of(time.monotonic() - lag)
    return web.Response(body=body, headers={"Content-Type": ctype})


class _LaggedPages:
    """The /metrics page rendered every few milliseconds and served as it was ``metrics_lag_s`` ago."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.pages: deque[tuple[float, tuple[bytes, str]]] = deque()

    async def run(self, keep_s: float) -> None:
        while True:
            now = time.monotonic()
            self.pages.append((now, exposition.render(self.engine)))
            while len(self.pages) > 1 and self.pages[1][0] <= now - keep_s:
                self.pages.popleft()
            await asyncio.sleep(0.01)

    def as_of(self, when: float) -> tuple[bytes, str]:
        chosen = self.pages[0][1] if self.pages else exposition.render(self.engine)
        for at, page in self.pages:
            if at > when:
                break
            chosen = page
        return chosen


_PAGES = web.AppKey("pages", _LaggedPages)


async def _dcgm(request: web.Request) -> web.Response:
    """The GPUs as a DCGM exporter's /metrics shows them (a separate exporter in production, port 9400)."""
    body, ctype = exposition.render_dcgm(request.app[_ENGINE])
    return web.Response(body=body, headers={"Content-Type": ctype})


def _int(body: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise RequestError(f"{key} must be a non-negative integer")
            return value
    return None


async def _chat(request: web.Request) -> web.StreamResponse:
    cfg = request.app[_CFG]
    eng = request.app[_ENGINE]
    try:
        body = json.loads(await request.read())
    except ValueError as exc:
        return _error(400, f"request body is not valid JSON: {exc}", "BadRequestError")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object", "BadRequestError")
    if body.get("model") not in (None, cfg.model):
        return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _error(400, "messages must be a non-empty list", "BadRequestError")
    bad_schema = _response_schema_problem(body.get("response_format"))
    if bad_schema is not None:
        return _error(400, bad_schema, "BadRequestError")
    if cfg.overload_rate and request.app[_RNG].random() < cfg.overload_rate:
        return _error(503, "The server is overloaded (simulated): retry later", "ServiceUnavailableError")
    stream = bool(body.get("stream"))
    rid = "chatcmpl-" + uuid.uuid4().hex
    try:
        prompt = render_prompt(body)
        ids = tokenizer.encode(prompt)
        limit = cfg.effective_max_model_len
        asked = _int(body, "max_completion_tokens", "max_tokens")
        max_tokens = asked if asked is not None else max(limit - len(ids), 0)
        if len(ids) + max_tokens > limit or len(ids) >= limit:
            return _error(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                          f"{len(ids) + max_tokens} tokens ({len(ids)} in the messages, {max_tokens} in the "
                          "completion). Please reduce the length of the messages or completion.", "BadRequestError")
        plan = plan_answer(body, prompt, stream=stream, defect_rates=cfg.defects, defect_rng=request.app[_RNG],
                           request_id=rid)
        floor = max_tokens if body.get("ignore_eos") else (_int(body, "min_tokens") or 0)
        if floor:
            extend_to(plan, min(floor, max_tokens), prompt)
    except RequestError as exc:
        return _error(400, str(exc), "BadRequestError")
    req = SimRequest(ids, eng.kv.block_hashes(ids), plan, max_tokens)
    try:
        eng.submit(req)
    except EngineDead as exc:
        return _error(500, str(exc), "InternalServerError")
    except QueueFull as exc:
        return _error(503, str(exc), "ServiceUnavailableError")
    if stream:
        return await _stream(request, eng, req, rid, body)
    try:
        while not req.done:
            await req.wake.wait()
            req.wake.clear()
    except asyncio.CancelledError:
        eng.abort(req)
        raise
    if req.error:
        return _error(500, req.error, "InternalServerError")
    return web.json_response(_completion(cfg, req, rid))


def _response_schema_problem(fmt: Any) -> str | None:
    """vLLM refuses a json_schema response_format it cannot compile with a 400 before scheduling."""
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    # lazy: jsonschema only for a json_schema response_format (the testbed's images copy the
    # simulator's module-level imports only, k3fleet/lab/testbed/podman.py)
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    schema = (fmt.get("json_schema") or {}).get("schema") if isinstance(fmt.get("json_schema"), dict) else None
    if schema is None:
        return None
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"Invalid JSON schema in response_format: {exc.message[:200]}"
    return None


def _usage(cfg: SimConfig, req: SimRequest) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": req.prompt_len, "completion_tokens": req.emitted,
                             "total_tokens": req.prompt_len + req.emitted}
    if cfg.enable_prompt_tokens_details:
        usage["prompt_tokens_details"] = {"cached_tokens": req.hit_tokens}
    return usage


def _assemble(plan: Plan, n: int) -> tuple[str, str, list[dict[str, Any]]]:
    reasoning, content = [], []
    calls: dict[int, dict[str, Any]] = {}
    for channel, text in plan.items[:n]:
        if channel == "reasoning":
            reasoning.append(text)
        elif channel == "content":
            content.append(text)
        else:
            i = int(channel[5:])
            if i not in calls:
                c = plan.tool_calls[i]
                calls[i] = {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
            else:
                calls[i]["function"]["arguments"] += text
    return "".join(reasoning), "".join(content), [calls[i] for i in sorted(calls)]


def _completion(cfg: SimConfig, req: SimRequest, rid: str) -> dict[str, Any]:
    reasoning, content, calls = _assemble(req.plan, req.emitted)
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None,
                               "reasoning": reasoning or None, "tool_calls": calls}
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": cfg.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": req.finish_reason}],
            "usage": _usage(cfg, req)}


class _Chunks:
    """Server-sent events for one stream, built by string formatting (thousands of streams share a
    core, so a chunk is one ``json.dumps`` of the token text, not of the whole object)."""

    def __init__(self, cfg: SimConfig, rid: str) -> None:
        self.head = (f'data: {{"id":"{rid}","object":"chat.completion.chunk","created":{int(time.time())},'
                     f'"model":{json.dumps(cfg.model)},"choices":[{{"index":0,"delta":')
        self.opened: set[int] = set()

    def delta(self, delta: str, finish: str | None = None) -> str:
        fin = "null" if finish is None else json.dumps(finish)
        return f'{self.head}{delta},"logprobs":null,"finish_reason":{fin}}}]}}\n\n'

    def item(self, plan: Plan, channel: str, text: str) -> str:
        if channel == "reasoning":
            return self.delta('{"reasoning":' + _j(text) + "}")
        if channel == "content":
            return self.delta('{"content":' + _j(text) + "}")
        i = int(channel[5:])
        index = 0 if plan.merged_stream else i
        if i not in self.opened:
            self.opened.add(i)
            call = plan.tool_calls[i]
            if plan.merged_stream and i > 0:
                return ""
            fn = {"name": call.name, "arguments": ""}
            return self.delta(_j({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                                  "function": fn}]}))
        args = _j({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
        return self.delta(args)


async def _stream(request: web.Request, eng: Engine, req: SimRequest, rid: str,
                  body: dict[str, Any]) -> web.StreamResponse:
    cfg = request.app[_CFG]
    opts = body.get("stream_options") or {}
    include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                   "Cache-Control": "no-cache"})
    chunks = _Chunks(cfg, rid)
    sent = 0
    stall = bool(cfg.stall_after_tool_call_rate) and request.app[_RNG].random() < cfg.stall_after_tool_call_rate
    try:
        await resp.prepare(request)
        while True:
            await req.wake.wait()
            req.wake.clear()
            parts: list[str] = []
            if sent == 0 and req.emitted > 0:
                parts.append(chunks.delta('{"role":"assistant","content":""}'))
            for channel, text in req.plan.items[sent:req.emitted]:
                parts.append(chunks.item(req.plan, channel, text))
            sent = max(sent, req.emitted)
            if req.done:
                if req.error:
                    parts.append("data: " + _j({"error": {"message": req.error, "type": "InternalServerError",
                                                         "code": 500}}) + "\n\n")
                else:
                    parts.append(chunks.delta("{}", req.finish_reason))
                    if include_usage:
                        parts.append("data: " + _j({"id": rid, "object": "chat.completion.chunk",
                                                    "created": int(time.time()), "model": cfg.model,
                                                    "choices": [], "usage": _usage(cfg, req)}) + "\n\n")
                parts.append("data: [DONE]\n\n")
            if parts:
                await resp.write("".join(parts).encode())
                if stall and any('"tool_calls"' in p for p in parts):
                    # The answer stops after its first tool-call delta: the client times out mid-answer.
                    await asyncio.sleep(cfg.stall_s)
                    eng.abort(req)
                    break
            if req.done:
                break
        await resp.write_eof()
    except ConnectionResetError:
        # The client hung up mid-stream (a load step ending, a probe's deadline): the request is
        # aborted as vLLM aborts it; nothing to log.
        eng.abort(req)
    except asyncio.CancelledError:
        eng.abort(req)
        raise
    return resp


def build_app(cfg: SimConfig) -> web.Application:
    app = web.Application(middlewares=[_auth], client_max_size=64 * 1024 * 1024)
    app[_CFG] = cfg
    app[_ENGINE] = Engine(cfg)
    app[_RNG] = random.Random(cfg.seed)

    app[_PAGES] = _LaggedPages(app[_ENGINE])
    pager: list[asyncio.Task[None]] = []

    async def on_startup(app: web.Application) -> None:
        app[_ENGINE].start()
        if cfg.metrics_lag_s > 0:
            pager.append(asyncio.get_running_loop().create_task(app[_PAGES].run(cfg.metrics_lag_s + 1.0)))

    async def on_cleanup(app: web.Application) -> None:
        for task in pager:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await app[_ENGINE].stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/dcgm/metrics", _dcgm)
    return app


def engine_of(app: web.Application) -> Engine:
    return app[_ENGINE]


async def serve(cfg: SimConfig, *, ready: threading.Event | None = None, stop: asyncio.Event | None = None,
                announce: bool = True, bound: dict[str, Any] | None = None) -> None:
    """Run until ``stop`` is set (or forever); prints ``listening on URL`` on stderr when bound."""
    app = build_app(cfg)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=4096, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1]
    if bound is not None:
        bound.update(port=port, engine=app[_ENGINE])
    if announce:
        print(f"listening on http://{_host_for_url(cfg.host)}:{port}", file=sys.stderr, flush=True)
    if ready is not None:
        ready.set()
    if stop is None:
        # Foreground server: Ctrl-C or SIGTERM stops it through the same clean shutdown.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class SimHandle:
    """A simulator serving from its own thread and event loop (tests, benchmarks)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._bound: dict[str, Any] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-sim", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"simulator did not start: {self._error}")
        self.base_url = f"http://{_host_for_url(cfg.host)}:{self._bound['port']}"
        self.engine: Engine = self._bound["engine"]

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._stop = asyncio.Event()
        try:
            self._loop.run_until_complete(serve(self.cfg, ready=self._ready, stop=self._stop, announce=False,
                                                bound=self._bound))
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    @property
    def port(self) -> int:
        port: int = self._bound["port"]
        return port

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the simulator's loop (to read engine state without racing it)."""
        return asyncio.run_coroutine_threadsafe(_call(fn), self._loop).result(10)

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)

    def __enter__(self) -> SimHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


async def _call(fn: Any) -> Any:
    return fn()


def start_simulator(cfg: SimConfig | None = None, **overrides: Any) -> SimHandle:
    """Start a simulator on a free loopback port; use as a context manager or call ``.stop()``."""
    base = cfg or SimConfig()
    if overrides:
        base = base.model_copy(update=overrides)
        base = SimConfig.model_validate(base.model_dump())
    return SimHandle(base)
