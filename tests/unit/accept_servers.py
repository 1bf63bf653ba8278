"""Misbehaving OpenAI-compatible servers on loopback for the bad-input tests (stdlib HTTP, real sockets)."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODEL = "m"


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet stdlib handler that answers with a whole body and its length (the test servers' base)."""

    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        return

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def trickling_chat(stop: threading.Event) -> type[JsonHandler]:
    """A server that lists model ``m`` at once and trickles every chat answer one byte every 0.1 s (the openai
    SDK's timeout is per read, so it never fires), until ``stop`` is set or the client goes."""
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 4096}]})

    class Trickle(JsonHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            ok = self.path == "/v1/models"
            self._send(200 if ok else 404, models.encode() if ok else b'{"detail": "Not Found"}')

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                    b'{"id": "x", "choices": [' + b" " * 2000)
            try:
                for byte in head:
                    if stop.is_set():
                        break
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass
            self.close_connection = True

    return Trickle


class _Handler(JsonHandler):
    mode = "ok"

    def do_GET(self) -> None:
        mode = type(self).mode
        if mode == "401":
            self._send(401, b'{"error": {"message": "Unauthorized", "type": "invalid_api_key", "code": 401}}')
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
        elif self.path == "/metrics":
            self._send(200, b"<html>not metrics</html>", "text/html")
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def do_POST(self) -> None:
        mode = type(self).mode
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if mode == "401":
            self._send(401, b'{"error": {"message": "Unauthorized"}}')
        elif mode == "500":
            self._send(500, b'{"error": {"message": "EngineCore died", "type": "InternalServerError", "code": 500}}')
        elif mode == "garbage":
            if body.get("stream"):
                self._stream([b"data: {not json\n\n", b"data: [DONE]\n\n"])
            else:
                self._send(200, b"<html>502 Bad Gateway</html>", "text/html")
        elif mode == "cut":
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                     "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}
            self._stream([b"data: " + json.dumps(chunk).encode() + b"\n\n"], cut=True)
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def _stream(self, parts: list[bytes], cut: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if cut:
            # A declared length the body never reaches: the client sees the stream end half-way.
            self.send_header("Content-Length", "100000")
        else:
            self.send_header("Content-Length", str(sum(len(p) for p in parts)))
        self.end_headers()
        for p in parts:
            self.wfile.write(p)
            self.wfile.flush()
        if cut:
            self.close_connection = True


@contextmanager
def loopback(handler: type[BaseHTTPRequestHandler], *, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """``handler`` served on a free loopback port in a thread (TLS with ``(cert, key)``); yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    scheme = "http"
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def bad_server(mode: str, *, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    with loopback(type("Handler", (_Handler,), {"mode": mode}), tls=tls) as url:
        yield url


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for 127.0.0.1 (cryptography comes with ansible-core)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_p, key_p = tmp / "cert.pem", tmp / "key.pem"
    cert_p.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_p.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
    return cert_p, key_p
