"""Secret canaries, second round: the places an attack round found (docs/safety.md "Redaction",
"Display"). Distinct values are planted in

- a vLLM start-up log: vLLM's own ``non-default args: {...}`` line (a Python dict repr with a list
  value for ``api_key`` and a string for ``hf_token``), read by ``accept startup``, ``accept all
  --log`` (copied into the run as ``inputs/startup.log``) and ``triage``;
- ``decide``'s ``--build`` record (``--build-arg HF_TOKEN=X``, an index URL ``__token__:X@``,
  ``GIT_CREDENTIALS=https://x:X@``, ``--password X``) and ``--owners`` file (a URL with user-info,
  ``api key: X`` in prose), printed as a table and as ``--json``;
- a pasted capture for ``triage`` (``bearer token X``);
- an HTTP server on 127.0.0.1 that answers 500 with the request's Authorization header and the bare
  API key in its error message, plus Rich markup, ESC and U+202E, and serves a model id with markup;
  the key comes from a variable whose name says nothing secret, so only the value rule can catch it;

then every file written (run directories and the evidence archive's members) and everything printed
on stdout and stderr are searched: no canary, no traceback, no raw ESC or U+202E on the terminal.
Hostile text (Rich markup, ESC, U+202E) in a reviewer name, a ``--host``, a server message and a model
id is stored as given (JSON) and printed as plain text, escaped in Markdown and HTML.

A 64 KB base64 line in a start-up log and a 100,000-character ``--host`` go through ``triage`` and
``accept all`` under a generous hang guard (each command must finish within 60 s; they take about a
second).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "decide"

# One distinct value per place; none is a real credential.
CANARY: dict[str, str] = {
    "log_dict_api_key": "dictkey0101Zq",
    "log_dict_hf_token": "dicthf0102Zq",
    "log_argv_api_key": "argvkey0103Zq",
    "build_arg_hf": "buildhf0104Zq",
    "build_index_url": "buildidx0105Zq",
    "build_git_credentials": "buildgit0106Zq",
    "build_password": "buildpw0107Zq",
    "owners_url": "ownersurl0108Zq",
    "owners_prose": "ownersprose0109Zq",
    "capture_bearer": "capbearer0110Zq",
    "server_key": "echoedkey0111Zq",
}
# Rich markup, an SGR sequence, an OSC title and a right-to-left override: text, never control.
HOSTILE = "[/bold][red]x[/red]\x1b[31m\x1b]0;pwned\x07\u202e"
RAW = ("\x1b", "\u202e", "\x07")
DIGEST = "4f6c3a9a1d0b8e2f7c5d9e1a3b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a0b2c"
# A host name may not carry "/" (it names files): its markup opens styles instead of closing one.
HOST_HOSTILE = "[bold red]x[red]\x1b[31m\x1b]0;pwned\x07\u202e"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "250", **(env or {})}
    # The hang guard: a redactor that is quadratic in the line length takes minutes on these inputs.
    return subprocess.run([str(BIN / "k3fleet"), *args], capture_output=True, text=True, env=full, timeout=60,
                          check=False)


class _Echo(BaseHTTPRequestHandler):
    """Serves a model whose id carries markup, answers everything else 500 with what it was sent."""

    model = f"k3{HOSTILE}"
    models_ok = True

    def log_message(self, *args: Any) -> None:  # quiet: the test reads the command's output only
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _echo(self) -> None:
        auth = self.headers.get("Authorization", "")
        key = auth.split()[-1] if auth else ""
        self._send(500, {"error": {"message": f"unknown caller {key} [/bold] (you sent Authorization: {auth}) "
                                              f"{HOSTILE}", "type": "InternalServerError"}})

    def do_GET(self) -> None:
        if self.path.startswith("/v1/models") and self.models_ok:
            self._send(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        else:
            self._echo()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._echo()


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    """Two loopback servers: one serves the model list and fails the probes, one fails at once."""
    made = []
    urls = {}
    for name, models_ok in (("probes", True), ("preflight", False)):
        handler = type(f"Echo_{name}", (_Echo,), {"models_ok": models_ok})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        made.append(httpd)
        urls[name] = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield urls
    for httpd in made:
        httpd.shutdown()
        httpd.server_close()


def _inputs(tmp: Path) -> dict[str, Path]:
    inp = tmp / "in"
    inp.mkdir()
    log = inp / "vllm.log"
    blob = base64.b64encode(bytes(range(256)) * 200).decode()[:64_000]
    log.write_text(
        (FIX / "startup_kimi_k3_tp8_dp2.log").read_text()
        + "(APIServer pid=1) INFO 08-14 09:13:01 [utils.py:326] non-default args: {'model_tag': 'moonshotai/Kimi-K3', "
          f"'model': '/m', 'api_key': ['{CANARY['log_dict_api_key']}'], 'hf_token': '{CANARY['log_dict_hf_token']}', "
          "'tensor_parallel_size': 8, 'max_tokens': 5}\n"
        + f"(APIServer pid=1) INFO 08-14 09:13:01 [launcher.py:29] argv: ['vllm', 'serve', '/m', '--api-key', "
          f"'{CANARY['log_argv_api_key']}', '--port', '8000']\n"
        + f"(APIServer pid=1) DEBUG 08-14 09:13:02 [core.py:1] blob {blob}\n")
    capture = inp / "capture.txt"
    capture.write_text("Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.65\n"
                       f"curl sent bearer token {CANARY['capture_bearer']} to the server\n")
    build = inp / "build.yaml"
    build.write_text(
        "image: registry.example.internal/ml/vllm-k3-cu129:2026-11\nsource_branch: k3\ncommit: 0123abcd4567ef89\n"
        'lockfile: "uv.lock sha256:abab"\n'
        f"build_command: docker build --build-arg HF_TOKEN={CANARY['build_arg_hf']} --build-arg "
        f"PIP_INDEX_URL=https://__token__:{CANARY['build_index_url']}@pypi.example/simple --build-arg "
        f"GIT_CREDENTIALS=https://x:{CANARY['build_git_credentials']}@git.example --password "
        f"{CANARY['build_password']} -f docker/Dockerfile .\n"
        f"digest: sha256:{DIGEST}\nrollback_image: vllm/vllm-openai:kimi-k3@sha256:{DIGEST}\n")
    owners = inp / "owners.yaml"
    owners.write_text(
        "items:\n  chain.agree:\n    owner: dana\n    deadline: 2026-12-15\n"
        f"    rollback: 'pin the baseline image; the api key: {CANARY['owners_prose']} stays in the vault'\n"
        f"    documented: https://dana:{CANARY['owners_url']}@wiki.example/k3-known-issues\n")
    return {"log": log, "capture": capture, "build": build, "owners": owners}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, servers: dict[str, str]) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("canary2")
    files = _inputs(tmp)
    out = tmp / "out"
    env = {"ECHO_CRED": CANARY["server_key"]}  # a name that says nothing secret: only its value is known
    host = f"gpu-m01{HOST_HOSTILE}"
    reviewer = f"carol{HOSTILE}"
    model = _Echo.model
    commands: dict[str, list[str]] = {
        "startup": ["accept", "startup", "--log", str(files["log"])],
        "startup-json": ["accept", "startup", "--log", str(files["log"]), "--json"],
        "accept-all": ["accept", "all", "--base-url", servers["probes"], "--model", model, "--api-key-env", "ECHO_CRED",
                       "--log", str(files["log"]), "--skip", "load", "--agent-repeats", "1", "--prefix-repeats", "1",
                       "--timeout", "10", "--out", str(out / "accept"), "--quiet"],
        "accept-agent": ["accept", "agent", "--base-url", servers["probes"], "--model", model, "--api-key-env",
                         "ECHO_CRED", "--repeats", "1", "--timeout", "10", "--quiet"],
        "accept-preflight": ["accept", "prefix-cache", "--base-url", servers["preflight"], "--model", model,
                             "--api-key-env", "ECHO_CRED", "--timeout", "10"],
        "triage": ["triage", str(files["log"]), str(files["capture"]), "--host", host, "--out", str(out / "triage")],
        "triage-json": ["triage", str(files["log"]), str(files["capture"]), "--host", host, "--json",
                        "--out", str(out / "triage-json")],
        "triage-long-host": ["triage", str(files["log"]), "--host", "h" * 100_000, "--out", str(out / "triage-long")],
        "decide": ["decide", str(out / "triage"), "--reviewer", reviewer, "--build", str(files["build"]),
                   "--owners", str(files["owners"]), "--out", str(out / "decision")],
        "decide-json": ["decide", str(out / "triage"), "--reviewer", reviewer, "--build", str(files["build"]),
                        "--owners", str(files["owners"]), "--json", "--out", str(out / "decision-json")],
        "report-md": ["report", str(out / "decision"), "--format", "md"],
        "report-html": ["report", str(out / "decision"), "--format", "html"],
    }
    done = {name: _run(*args, env=env) for name, args in commands.items()}
    return {"out": out, "done": done, "host": host, "reviewer": reviewer, "model": model}


def test_every_command_ran_without_a_traceback(runs: dict[str, Any]) -> None:
    done = runs["done"]
    for name, proc in done.items():
        assert "Traceback" not in proc.stderr and "MarkupError" not in proc.stderr, (name, proc.stderr[-3000:])
    expected = {"startup": (0, 1), "startup-json": (0, 1), "accept-all": (1, 3), "accept-agent": (1, 3),
                "accept-preflight": (3,), "triage": (1,), "triage-json": (1,), "triage-long-host": (0, 1),
                "decide": (1, 3), "decide-json": (1, 3), "report-md": (0,), "report-html": (0,)}
    for name, codes in expected.items():
        assert done[name].returncode in codes, (name, done[name].returncode, done[name].stderr[-2000:])
    out: Path = runs["out"]
    for name in ("accept", "triage", "triage-long", "decision", "decision-json"):
        assert (out / name / "manifest.json").is_file(), name
    assert (out / "decision.tar.gz").is_file()
    # The server's error did reach the output: the redaction, not its absence, keeps the key out.
    assert "unknown caller ***" in done["accept-preflight"].stderr, done["accept-preflight"].stderr


def _written(out: Path) -> list[tuple[str, bytes]]:
    files = []
    for p in sorted(out.rglob("*")):
        if not p.is_file():
            continue
        files.append((str(p.relative_to(out)), p.read_bytes()))
        if p.name.endswith(".tar.gz"):
            with tarfile.open(p, "r:gz") as tar:
                for member in tar:
                    f = tar.extractfile(member)
                    if f is not None:
                        files.append((f"{p.name}:{member.name}", f.read()))
    return files


def test_no_canary_in_any_file_written(runs: dict[str, Any]) -> None:
    files = _written(runs["out"])
    assert len(files) > 30 and any(":" in name for name, _ in files), [n for n, _ in files]
    leaks = [f"{name}: {where}" for name, data in files for where, value in CANARY.items() if value.encode() in data]
    assert leaks == []
    # The evidence is there, the secrets replaced: a reviewer sees that a key was present.
    startup = (runs["out"] / "accept" / "inputs" / "startup.log").read_text()
    assert "'api_key': ['***'], 'hf_token': '***'" in startup and "'--api-key', '***'" in startup
    build = (runs["out"] / "decision" / "inputs" / "build.yaml").read_text()
    assert "HF_TOKEN=***" in build and "__token__:***@pypi.example" in build and "--password ***" in build


def test_no_canary_and_no_control_code_on_the_terminal(runs: dict[str, Any]) -> None:
    leaks = []
    for name, proc in runs["done"].items():
        for stream, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            leaks += [f"{name} {stream}: {where}" for where, value in CANARY.items() if value in text]
            leaks += [f"{name} {stream}: raw {raw!r}" for raw in RAW if raw in text and not name.startswith("report")]
    assert leaks == []
    done = runs["done"]
    # What the decision printed includes the build record's command, redacted.
    assert "HF_TOKEN=***" in done["decide"].stdout + done["decide-json"].stdout


def test_hostile_text_is_stored_as_given_and_printed_as_text(runs: dict[str, Any]) -> None:
    out: Path = runs["out"]
    done = runs["done"]
    triage = json.loads((out / "triage" / "triage.json").read_text())
    assert triage["host"] == runs["host"]
    decision = json.loads((out / "decision" / "decision.json").read_text())
    assert decision["reviewer"] == runs["reviewer"]
    assert json.loads((out / "accept" / "accept.json").read_text())["model"] == runs["model"]
    # Printed: the markup shows as text, the control codes are gone.
    assert "gpu-m01[bold red]x[red]" in done["triage"].stdout
    assert "k3[/bold][red]x[/red]" in done["accept-all"].stdout
    assert "[/bold]" in done["accept-preflight"].stderr
    # --json prints the values as given, escaped by JSON.
    assert json.loads(done["triage-json"].stdout)["host"] == runs["host"]
    assert json.loads(done["decide-json"].stdout)["reviewer"] == runs["reviewer"]
    # Reports: Markdown escapes the markup, HTML escapes it, neither carries the control codes.
    md, html = done["report-md"].stdout, done["report-html"].stdout
    for text in (md, html, (out / "decision" / "report.md").read_text()):
        for raw in RAW:
            assert raw not in text
    assert "carol\\[/bold\\]\\[red\\]x\\[/red\\]" in md
    assert "carol[/bold][red]x[/red]" in html
