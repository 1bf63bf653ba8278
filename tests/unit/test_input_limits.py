"""Issue 35, "Inputs with limits": nothing a user names or a server sends can recurse, expand or hang k3fleet.

Grouped by surface: the shared helpers of k3fleet.bounds (nesting and alias budget), the YAML records
(profile, owners, build, target, lab profile), JSON readers (run files, manifests, triage, prefix-lint,
merge), key files, inventories, and names. Every case is refused by a cap or a count, never by reading
gigabytes: the hostile inputs are small (a sparse file allocates nothing), and each test runs the real
CLI in-process (``k3fleet.cli.base.main``). Before the issue each of these ended in a RecursionError or
MemoryError traceback, a hang, or gigabytes of memory.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
import yaml
from accept_servers import loopback

from k3fleet.bounds import (
    MAX_NESTING,
    InputTooLarge,
    JSONTooDeep,
    check_yaml,
    json_too_deep,
    load_yaml,
    loads_json,
)
from k3fleet.cli.base import main
from k3fleet.errors import UsageError
from k3fleet.evidence import RunDir

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "k3fleet" / "targets" / "profiles"


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("k3fleet: error:")]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


def _bomb(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs" YAML: ``levels`` anchors, each ``width`` aliases of the one before (9 x 9: 387M nodes)."""
    rows = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        rows.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(rows) + "\n"


DEEP_FLOW = "[" * 100_000 + "]" * 100_000
DEEP_JSON = "[" * 200_000 + "]" * 200_000
DEEP_OBJECTS = '{"a":' * 5000 + "1" + "}" * 5000


# -- k3fleet.bounds: nesting and aliases -----------------------------------------------------------


@pytest.mark.parametrize(("text", "deep"), [
    ("[]", False), ("[" * MAX_NESTING + "]" * MAX_NESTING, False), ("[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1),
                                                                        True),
    (DEEP_JSON, True), (DEEP_OBJECTS, True),
    # Brackets inside strings are text, not nesting (also with escaped quotes before them).
    (json.dumps(["[" * 1000, '\\"' + "{" * 500]), False),
    (json.dumps({"a": [{"b": [1, 2, {"c": "]]]"}]}] * 1000}), False),
])
def test_json_nesting_is_measured_without_recursion(text: str, deep: bool) -> None:
    assert json_too_deep(text) is deep
    if deep:
        with pytest.raises(JSONTooDeep) as info:
            loads_json(text)
        assert isinstance(info.value, ValueError) and "nested deeper than 128 levels" in str(info.value)
    else:
        assert loads_json(text) == json.loads(text)


def test_yaml_budget_refuses_bombs_and_nests_but_keeps_anchors() -> None:
    with pytest.raises(InputTooLarge, match="more than 2000000 nodes once its aliases are expanded"):
        check_yaml(_bomb(), "profile p.yaml")
    for deep in (DEEP_FLOW, "- " * 300 + "x\n", "".join("  " * i + "k:\n" for i in range(300)) + "  " * 300 + "v\n"):
        with pytest.raises(UsageError, match="YAML nested deeper than 128 levels"):
            load_yaml(deep, "profile p.yaml")
    # A reasonable use of anchors loads as before, and malformed YAML is still the loader's own error.
    assert load_yaml("base: &b {x: 1}\nother: *b\nlist: [*b, *b]\n", "p") == {
        "base": {"x": 1}, "other": {"x": 1}, "list": [{"x": 1}, {"x": 1}]}
    with pytest.raises(yaml.YAMLError):
        load_yaml("a: [\n", "p")


# -- YAML records: profile, owners, build, target, lab profile -----------------------------------------


def _accept_run(tmp_path: Path) -> Path:
    """A whole accept run with its start-up probe (the endpoint is closed: exit 3, the run kept), for decide.
    The log is tests/fixtures/decide/startup_kimi_k3_tp8_dp2.log (source in that directory's SOURCES.md)."""
    out = tmp_path / "acc"
    assert main(["accept", "all", "--base-url", "http://127.0.0.1:9", "--model", "m", "--log",
                 str(REPO / "tests" / "fixtures" / "decide" / "startup_kimi_k3_tp8_dp2.log"), "--skip", "prefix_cache",
                 "--skip", "agent", "--skip", "load", "--out", str(out), "-q"]) == 3
    return out


def _profile_with(tmp_path: Path, tools: str | None = None, schema: str | None = None) -> Path:
    d = tmp_path / "profile"
    shutil.copytree(PROFILES, d)
    if tools is not None:
        (d / "tools" / "oncall_tools.json").write_text(tools)
    if schema is not None:
        (d / "schemas" / "incident_summary.json").write_text(schema)
    return d / "lab-small.yaml"


@pytest.mark.parametrize(("flag", "body", "want"), [
    ("--owners", _bomb(), "YAML with more than 2000000 nodes"),
    ("--owners", DEEP_FLOW, "YAML nested deeper than 128 levels"),
    ("--build", _bomb(), "YAML with more than 2000000 nodes"),
    ("--build", DEEP_OBJECTS, "YAML nested deeper than 128 levels"),
    ("--profile", _bomb(), "YAML with more than 2000000 nodes"),
    ("--profile", DEEP_FLOW, "YAML nested deeper than 128 levels"),
    ("--target", _bomb(), "YAML with more than 2000000 nodes"),
    ("--target", DEEP_FLOW, "YAML nested deeper than 128 levels"),
])
def test_decide_records_with_bombs_and_nests_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          flag: str, body: str, want: str) -> None:
    record = tmp_path / "record.yaml"
    record.write_text(body)
    run = _accept_run(tmp_path)
    capsys.readouterr()
    assert main(["decide", "--reviewer", "carol", "--runs-dir", str(tmp_path / "runs"), flag, str(record),
                 str(run)]) == 2
    assert want in _one_line(capsys)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("tools", "schema", "want"), [
    (None, json.dumps({"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/a.json"}}}),
     "$ref 'http://127.0.0.1:9/a.json' at /properties/a: only references inside the schema"),
    (None, json.dumps({"$ref": "other.json"}), "$ref 'other.json' at (top level)"),
    (json.dumps([{"type": "function", "function": {"name": "t", "parameters": {"$ref": "https://x/s.json"}}}]),
     None, "tool t: parameters: $ref 'https://x/s.json'"),
    (json.dumps([{"name": f"t{i}", "parameters": {"type": "object"}} for i in range(40_000)]), None,
     "40000 tools: at most 512 per profile"),
    (DEEP_JSON, None, "YAML nested deeper than 128 levels"),
])
def test_profile_tools_and_schemas_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                tools: str | None, schema: str | None, want: str) -> None:
    profile = _profile_with(tmp_path, tools, schema)
    assert main(["accept", "all", "--base-url", "http://127.0.0.1:9", "--model", "m", "--profile", str(profile),
                 "--runs-dir", str(tmp_path / "runs"), "-q"]) == 2
    assert want in _one_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_a_response_schema_with_a_remote_ref_is_never_fetched() -> None:
    from k3fleet.accept.toolcheck import _schema_error

    # Port 9 (discard) is closed here: a fetch would fail with a connection error, not this line.
    assert _schema_error({"a": 1}, {"properties": {"a": {"$ref": "http://127.0.0.1:9/a.json"}}}) == (
        "the schema refers to 'http://127.0.0.1:9/a.json', which k3fleet does not fetch")


def _lab_fleet(tmp_path: Path, profile_body: str | None = None, raw: str | None = None) -> Path:
    d = tmp_path / "fleet"
    (d / "profiles").mkdir(parents=True)
    shutil.copy(REPO / "inventories" / "lab" / "profiles" / "h200-r580.yaml", d / "profiles" / "base.yaml")
    body = profile_body if profile_body is not None else "extends: base\n"
    if raw is not None:
        body += f"raw_file:\n  nvidia_smi_q: {raw}\n"
    (d / "profiles" / "odd.yaml").write_text(body)
    (d / "fleet.yaml").write_text(yaml.safe_dump({"profiles_dir": str(d / "profiles"),
                                                  "hosts": {"gpu-01": {"profile": "odd"}}}))
    return d / "fleet.yaml"


@pytest.mark.parametrize(("body", "raw", "want"), [
    (_bomb(), None, "YAML with more than 2000000 nodes"),
    (DEEP_FLOW, None, "YAML nested deeper than 128 levels"),
    (None, "/dev/zero", "raw_file.nvidia_smi_q: cannot read /dev/zero is a character device, not a raw capture"),
    (None, "FIFO", "is a FIFO, not a raw capture"),
    (None, "SPARSE", "too large for a raw capture"),
])
def test_lab_profiles_and_their_raw_files_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      body: str | None, raw: str | None, want: str) -> None:
    if raw == "FIFO":
        os.mkfifo(tmp_path / "fifo")
        raw = str(tmp_path / "fifo")
    elif raw == "SPARSE":
        with open(tmp_path / "sparse.txt", "wb") as fh:
            fh.truncate(300 << 20)
        raw = str(tmp_path / "sparse.txt")
    fleet = _lab_fleet(tmp_path, body, raw)
    assert main(["lab", "generate", str(tmp_path / "gen"), "--fleet", str(fleet)]) == 2
    line = _one_line(capsys)
    assert want in line, line


# -- JSON readers -----------------------------------------------------------------------------------


def _run_with(tmp_path: Path, kind: str, rel: str, body: str, **more: str) -> Path:
    rd = RunDir.create(tmp_path, kind, ["k3fleet", kind], out=tmp_path / "run")
    for name, text in {rel: body, **more}.items():
        (rd.path / name).write_text(text)
    rd.write_manifest()
    return rd.path


@pytest.mark.parametrize("cmd", [["plan", "--run", "RUN"], ["report", "RUN", "--format", "md", "--out", "-"],
                                 ["decide", "--reviewer", "carol", "--runs-dir", "RUNS", "RUN"]])
def test_run_files_nested_too_deep_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                cmd: list[str]) -> None:
    run = _run_with(tmp_path, "audit", "verdict.json", DEEP_JSON, **{"run.json": "{}"})
    swap = {"RUN": str(run), "RUNS": str(tmp_path / "runs")}
    rc = main([swap.get(a, a) for a in cmd])
    assert rc in (2, 3)
    assert "nested deeper than 128 levels" in _one_line(capsys)


def test_a_manifest_nested_too_deep_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_with(tmp_path, "audit", "verdict.json", "{}")
    (run / "manifest.json").write_text(DEEP_OBJECTS)
    assert main(["verify", str(run)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and "nested deeper than 128 levels" in err


def test_merge_of_runner_events_nested_too_deep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "artifacts" / "job-1"
    (job / "job_events").mkdir(parents=True)
    (job / "job_events" / "1-abc.json").write_text('{"event": "runner_on_ok", "event_data": ' + DEEP_OBJECTS + "}")
    (job / "status").write_text("successful")
    rc = main(["merge", str(job), "--out", str(tmp_path / "merged")])
    assert rc == 2
    assert "nested deeper than 128 levels" in _one_line(capsys)


@pytest.mark.parametrize(("args", "body"), [
    (["triage", "--kind", "docker_inspect"], '[{"Id": "x", "Config": {"Labels": ' + DEEP_JSON + "}}]"),
    (["triage"], DEEP_JSON),
    (["accept", "prefix-lint"], '{"messages": ' + DEEP_JSON + "}\n"),
])
def test_pasted_json_nested_too_deep(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                     body: str) -> None:
    capture = tmp_path / "paste.json"
    capture.write_text(body)
    rc = main([*args, str(capture), *(["--runs-dir", str(tmp_path / "runs")] if args[0] == "triage" else [])])
    assert rc == 2
    _one_line(capsys)


# -- key files --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "sparse"])
def test_sign_key_that_is_no_regular_small_file_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   kind: str) -> None:
    if kind == "fifo":
        key = tmp_path / "keys" / "id_fifo"
        key.parent.mkdir()
        os.mkfifo(key)
        want = "is a FIFO, not an OpenSSH key"
    elif kind == "sparse":
        key = tmp_path / "keys" / "id_sparse"
        key.parent.mkdir()
        with open(key, "wb") as fh:
            fh.truncate(300 << 20)
        want = "314572800 bytes: too large for an OpenSSH key (limit 1048576 bytes; K3FLEET_MAX_KEY_BYTES"
    else:
        key = Path(kind)
        want = "is a character device, not an OpenSSH key"
    run = _accept_run(tmp_path)
    capsys.readouterr()
    assert main(["decide", "--reviewer", "carol", "--sign-key", str(key), "--runs-dir", str(tmp_path / "runs"),
                 str(run)]) == 2
    assert want in _one_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_sign_key_with_an_ssh_agent_that_never_answers_ends_at_its_deadline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A real unix socket at SSH_AUTH_SOCK that accepts and never answers held `decide --sign-key` for
    120 s (ssh-keygen asks the agent for its keys, a key file's too, and waits): the agent is asked first,
    under its own deadline (shortened here), and its silence is one line, exit 3, nothing written."""
    from k3fleet.decide import signing

    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    key = tmp_path / "keys" / "id_ed25519"
    key.parent.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "carol", "-f", str(key)], check=True)
    run = _accept_run(tmp_path)
    where = Path(tempfile.mkdtemp(prefix="agent-", dir="/tmp")) / "s"  # a unix socket path is at most 108 bytes
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(where))
    listener.listen(4)
    held: list[socket.socket] = []

    def hold() -> None:  # an agent that takes every connection and never answers, until the test closes it
        try:
            for _ in range(4):
                held.append(listener.accept()[0])
        except OSError:
            return

    accepting = threading.Thread(target=hold, daemon=True)
    accepting.start()
    monkeypatch.setenv("SSH_AUTH_SOCK", str(where))
    monkeypatch.setattr(signing, "AGENT_TIMEOUT_S", 1.0)
    capsys.readouterr()
    try:
        rc = main(["decide", "--reviewer", "carol", "--sign-key", str(key), "--runs-dir", str(tmp_path / "runs"),
                   str(run)])
    finally:
        listener.close()
        for conn in held:
            conn.close()
        shutil.rmtree(where.parent)
    assert rc == 3
    line = _one_line(capsys)
    assert f"signing with {key}: the ssh agent at {where} (SSH_AUTH_SOCK) did not answer within 1 s" in line, line
    assert not (tmp_path / "runs").exists()


# -- inventories --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["fifo", "/dev/zero", "sparse", "bomb in host_vars", "deep", "fifo in group_vars"])
def test_inventories_are_bounded_before_ansible_reads_them(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           case: str) -> None:
    inv = tmp_path / "hosts.yml"
    plain = {"all": {"hosts": {"gpu-01": {"ansible_host": "127.0.0.1"}}}}
    if case == "fifo":
        os.mkfifo(inv)
        want = "is a FIFO, not an inventory file"
    elif case == "/dev/zero":
        inv = Path("/dev/zero")
        want = "is a character device, not an inventory file"
    elif case == "sparse":
        with open(inv, "wb") as fh:
            fh.truncate(200 << 20)
        want = "too large for an inventory file (limit 67108864 bytes; K3FLEET_MAX_INVENTORY_BYTES raises it)"
    elif case == "bomb in host_vars":
        inv.write_text(yaml.safe_dump(plain))
        (tmp_path / "host_vars").mkdir()
        (tmp_path / "host_vars" / "gpu-01.yml").write_text(_bomb())
        want = "gpu-01.yml: YAML with more than 2000000 nodes once its aliases are expanded"
    elif case == "deep":
        inv.write_text("all:\n  hosts:\n    gpu-01:\n      deep: " + DEEP_FLOW + "\n")
        want = "YAML nested deeper than 128 levels"
    else:
        inv.write_text(yaml.safe_dump(plain))
        (tmp_path / "group_vars").mkdir()
        os.mkfifo(tmp_path / "group_vars" / "all.yml")
        want = "all.yml is a FIFO, not an inventory file"
    assert main(["audit", "-i", str(inv), "--out", str(tmp_path / "run")]) == 2
    assert want in _one_line(capsys)
    assert not (tmp_path / "run").exists()


# -- names ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["x" * 300, "é" * 200])
def test_an_out_name_too_long_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    assert main(["audit", "--lab", "--out", str(tmp_path / name)]) == 2
    assert "file names are at most 255 bytes" in _one_line(capsys)


# -- servers: a deadline for the whole answer, prompts against the server's context -------------------


def test_a_ladder_rung_far_above_the_servers_context_is_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--ladder 16,60000000` built a 60M-token prompt (877 MB) before anything checked it; now a rung is built
    at most twice the server's max_model_len (still refused there, with its own message)."""
    import asyncio

    import k3fleet.accept.load.run as load_run
    from k3fleet.accept.client import Endpoint
    from k3fleet.accept.load import LoadOptions, run_load
    from k3fleet.lab.vllm_sim import start_simulator

    words: list[int] = []
    real = load_run.filler

    def counted(n: int, seed: int = 0) -> str:
        words.append(n)
        return real(n, seed)

    monkeypatch.setattr(load_run, "filler", counted)
    opts = LoadOptions(ladder_tokens=[256, 4_000_000], ladder_output_tokens=8, ladder_repeats=1,
                       phases=["long_input"], sample_interval_s=0.25)
    with start_simulator(itl_ms=2.0, prefill_ms_per_token=0.005, max_model_len=2048) as sim:
        res = asyncio.run(run_load(Endpoint(base_url=sim.base_url, model="moonshotai/Kimi-K3", timeout_s=30), opts))
    assert res.data["outcome"] == "adjust_config"
    assert res.data["failures"][0]["context_tokens"] == 4_000_000
    assert "maximum context length is 2048" in res.data["failures"][0]["message"]
    assert max(words) < 2 * 2048, max(words)


def test_a_ladder_beyond_any_context_is_refused_as_usage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["accept", "load", "--base-url", "http://127.0.0.1:9", "--model", "m", "--ladder", "16,60000000",
                 "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "a generated prompt is at most 4194304 tokens" in _one_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_the_reference_client_has_one_deadline_for_the_whole_answer(capsys: pytest.CaptureFixture[str]) -> None:
    """A server that trickles its chat answer one byte every 0.1 s held `accept agent --timeout 2` for 161 s (the
    openai SDK's timeout is per read); with one deadline per request the whole suite ends in seconds."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler

    models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 4096}]}).encode()
    stop = threading.Event()

    class Trickle(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def do_GET(self) -> None:
            ok = self.path == "/v1/models"
            body = models if ok else b'{"detail": "Not Found"}'
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

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

    with loopback(Trickle) as url:
        try:
            rc = main(["accept", "agent", "--base-url", url, "--model", "m", "--timeout", "1", "-n", "1", "--json"])
        finally:
            stop.set()
    assert rc == 3
    out = capsys.readouterr().out
    # The SDK's call is cut by the same deadline as every other request, and says so.
    assert "the openai SDK's request did not finish within 1 s (one deadline for the whole request)" in out, out[-2000:]


# -- large logs ---------------------------------------------------------------------------------------


def test_a_long_servers_routine_lines_are_skipped_but_not_what_hides_in_them() -> None:
    """triage of a 50 MB vLLM log ran ~50 regular expressions on each of its 400,000 lines (45 s): the metrics
    logger's and uvicorn's lines (whole-line shapes) now cost one match, and the start-up reads the same."""
    from k3fleet.accept.startup import _each_line, analyse_startup

    src = (REPO / "tests" / "fixtures" / "decide" / "startup_kimi_k3_tp8_dp2.log").read_text()
    routine = ("(APIServer pid=1) INFO 08-14 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 "
               "tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
               "GPU KV cache usage: 0.1%, Prefix cache hit rate: 50.0%\n"
               '(APIServer pid=1) INFO:     127.0.0.1:45678 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
    plain, padded = analyse_startup(src), analyse_startup(src + routine * 2000)
    assert padded.data == plain.data and padded.status == plain.status
    assert [f.check_id for f in padded.findings] == [f.check_id for f in plain.findings]
    hidden = routine.replace("Prefix cache hit rate: 50.0%", "torch.OutOfMemoryError: CUDA out of memory")
    assert "accept.startup.load_oom" in {f.check_id for f in analyse_startup(src + hidden).findings}
    for text in ("a\nb\r\nc\rd\n\ne", "", "\n", "x\u2028y\n", "a\n\n"):
        assert list(_each_line(text)) == text.splitlines()


def test_a_server_answering_json_nested_200000_deep(capsys: pytest.CaptureFixture[str]) -> None:
    """`accept agent` against a server whose every answer nests 200,000 arrays: no RecursionError anywhere (the
    probe's reader, the openai SDK's own parse), an incomplete run (exit 3)."""
    from http.server import BaseHTTPRequestHandler

    models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
    deep = ('{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop", "message": '
            '{"role": "assistant", "content": "x", "extra": ' + DEEP_JSON + "}}]}").encode()

    class Deep(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(models if self.path == "/v1/models" else deep)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(deep)

    with loopback(Deep) as url:
        rc = main(["accept", "agent", "--base-url", url, "--model", "m", "--timeout", "5", "-n", "1", "--json"])
    captured = capsys.readouterr()
    assert rc == 3 and "Traceback" not in captured.err and "RecursionError" not in captured.err
    assert "answered 200 with a body that is not JSON" in captured.out, captured.out[-2000:]


def test_a_large_inventory_without_aliases_is_no_bomb() -> None:
    """The node budget is for expansion: 100,000 hosts written out (over 2 million nodes) load; a bomb does not."""
    inv = "all:\n  hosts:\n" + "".join(f"    gpu-{i:06d}: {{ansible_host: 10.0.0.1, a: 1, b: 2, c: 3, d: 4, e: 5}}\n"
                                       for i in range(100_000))
    check_yaml(inv, "inventory hosts.yml")
    with pytest.raises(InputTooLarge):
        check_yaml(inv + _bomb(), "inventory hosts.yml")
