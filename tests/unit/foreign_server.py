"""A foreign OpenAI-compatible server on loopback (stdlib http.server, real sockets): it answers chat
completions (plain and streamed, with usage) and lists its model, but has no ``vllm:*`` metrics, no
prefix cache, no ``/tokenize`` and no ``max_model_len``: what the probes meet outside vLLM.

``mode`` "nonjson" answers every chat completion 200 with a JSON content type and a body that is not
JSON. Warm requests (every chat after the first) are slower than the cold one, so a TTFT rule alone
would call the prefix cache broken.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from accept_servers import JsonHandler, loopback

MODEL = "foreign-model"


@dataclass
class Foreign:
    base_url: str
    chats: list[dict[str, Any]]


def _handler(mode: str, chats: list[dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
            elif self.path == "/metrics":
                # Prometheus text, but only the process's own metrics: nothing of a serving engine.
                self._send(200, b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n",
                           "text/plain; version=0.0.4")
            elif self.path == "/health":
                self._send(200, b"{}")
            else:
                self._send(404, b'{"detail": "Not Found"}')

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/chat/completions":
                self._send(404, b'{"detail": "Not Found"}')
                return
            chats.append(body)
            if mode == "nonjson":
                self._send(200, b"upstream timed out; this is not JSON")
                return
            if len(chats) > 1:
                time.sleep(0.05)  # warm slower than cold: TTFT alone would say the cache is broken
            prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages", [])) // 4 + 8
            words = ["fine", "and", "you"][: max(1, min(3, int(body.get("max_tokens") or 3)))]
            usage = {"prompt_tokens": prompt, "completion_tokens": len(words), "total_tokens": prompt + len(words)}
            if not body.get("stream"):
                self._send(200, json.dumps({
                    "id": "c1", "object": "chat.completion", "created": 0, "model": MODEL,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": " ".join(words)},
                                 "finish_reason": "stop"}], "usage": usage}).encode())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for w in words:
                chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                         "choices": [{"index": 0, "delta": {"content": w + " "}, "finish_reason": None}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            end = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            self.wfile.write(b"data: " + json.dumps(end).encode() + b"\n\n")
            if (body.get("stream_options") or {}).get("include_usage"):
                self.wfile.write(b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk",
                                                         "choices": [], "usage": usage}).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


@contextmanager
def foreign_server(mode: str = "ok") -> Iterator[Foreign]:
    chats: list[dict[str, Any]] = []
    with loopback(_handler(mode, chats)) as url:
        yield Foreign(url, chats)
