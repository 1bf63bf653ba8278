"""The change night's serving smoke, below the testbed: the stand-in image's `vllm serve` (the simulator
behind vLLM's command line, k3fleet/lab/testbed/files/vllm_serve.py), the readiness wait k3_verify runs
on the node (roles/k3_verify/files/smoke_wait.py), and the serving layer the testbed adds to its images.

The end-to-end smoke (real podman in booted guests, a change night rolled back) is
tests/system/test_change_smoke.py.
"""

from __future__ import annotations

import http.server
import importlib.util
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from k3fleet.lab.testbed import podman

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "k3fleet" / "lab" / "testbed" / "files" / "vllm_serve.py"
WAIT = ROOT / "ansible_collections" / "k3fleet" / "gpu" / "roles" / "k3_verify" / "files" / "smoke_wait.py"
# Real /proc/driver/nvidia/version lines (sources in k3fleet/lab/standin/reference/SOURCES.md).
REFERENCE = ROOT / "k3fleet" / "lab" / "standin" / "reference"
# What the stand-in driver writes for the two branches of the night (nvidia_sim_proc.VERSION_LINE).
LINE_575 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  575.57.08  Thu May 29 10:12:41 UTC 2025\n"
LINE_580 = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build"
            "  (dvs-builder@U22-I3-AE18-23-3)  Tue Sep 23 09:51:11 UTC 2025\n")


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def serve() -> ModuleType:
    return load(SERVE, "k3fleet_testbed_vllm_serve")


@pytest.fixture(scope="module")
def wait_mod() -> ModuleType:
    return load(WAIT, "k3fleet_smoke_wait")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- vllm serve's command line ------------------------------------------------------------------


def test_serve_line_takes_the_last_value_of_a_flag_and_lists_the_ones_it_ignores(serve: ModuleType) -> None:
    known, rest = serve.parse_serve(["serve", "moonshotai/Kimi-K3", "--port", "8000", "--tensor-parallel-size", "8",
                                     "--trust-remote-code", "--api-key", "sk-abcdefghijklmnop",
                                     "--tool-call-parser=kimi_k3", "--host", "127.0.0.1", "--port", "18000"])
    assert (known.model_tag, known.port, known.host) == ("moonshotai/Kimi-K3", 18000, "127.0.0.1")
    logged = serve.non_default_args(known, rest)
    assert logged["port"] == 18000 and logged["api_key"] == "***"
    assert logged["tensor_parallel_size"] == "8" and logged["trust_remote_code"] is True
    assert logged["tool_call_parser"] == "kimi_k3"
    cfg = serve.sim_config(known)
    assert (cfg.model, cfg.host, cfg.port, cfg.api_key_env) == ("moonshotai/Kimi-K3", "127.0.0.1", 18000,
                                                                serve.API_KEY_ENV)


def test_served_model_name_and_block_size_reach_the_simulator(serve: ModuleType) -> None:
    known, _ = serve.parse_serve(["serve", "--model", "m", "--served-model-name", "kimi", "other",
                                  "--block-size", "100", "--no-enable-prefix-caching"])
    cfg = serve.sim_config(known)
    assert (cfg.model, cfg.block_size, cfg.prefix_caching, cfg.prefix_match_unit) == ("kimi", 100, False, 0)


def test_anything_but_serve_is_refused(serve: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        serve.parse_serve(["chat", "--url", "x"])
    assert exc.value.code == 2
    assert "knows only `serve`" in capsys.readouterr().err


# -- CUDA initialisation against the stand-in driver ------------------------------------------------


@pytest.mark.parametrize(("text", "branch"), [
    (LINE_575, 575), (LINE_580, 580),
    ((REFERENCE / "proc-driver-nvidia-version.proprietary.txt").read_text(), 384),
    ((REFERENCE / "proc-driver-nvidia-version.open.txt").read_text(), 565),
    ("garbage\n", None),
])
def test_loaded_branch_from_the_version_file(serve: ModuleType, tmp_path: Path, text: str,
                                             branch: int | None) -> None:
    path = tmp_path / "version"
    path.write_text(text)
    assert serve.loaded_branch(str(path)) == branch


def test_no_version_file_is_no_driver(serve: ModuleType, tmp_path: Path) -> None:
    assert serve.loaded_branch(str(tmp_path / "absent")) is None


@pytest.mark.parametrize(("branch", "cuda", "problem"), [
    (None, "13.0.2", "No CUDA GPUs are available"),
    (575, "13.0.2", "The NVIDIA driver on your system is too old (found version 12090)"),
    (580, "13.0.2", None),
    (575, "12.9.1", None),
    (580, "12.9.1", None),
    # A branch the stand-in has no table row for is not judged: CUDA initialises.
    (565, "13.0.2", None),
])
def test_cuda_initialisation(serve: ModuleType, branch: int | None, cuda: str, problem: str | None) -> None:
    found = serve.cuda_problem(branch, cuda)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_the_knob(serve: ModuleType, tmp_path: Path) -> None:
    knob = tmp_path / "serve-fault"
    assert serve.read_fault(str(knob)) is None
    for word in serve.FAULTS:
        knob.write_text(f"{word}\n# a comment after the word\n")
        assert serve.read_fault(str(knob)) == word
    knob.write_text("")
    assert serve.read_fault(str(knob)) is None
    knob.write_text("explode\n")
    with pytest.raises(ValueError, match="unknown fault 'explode'"):
        serve.read_fault(str(knob))


# -- the stand-in server, as its container runs it ------------------------------------------------


class Server:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc, self.port = proc, port

    def get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def chat(self) -> tuple[int, dict[str, object]]:
        body = json.dumps({"model": "moonshotai/Kimi-K3", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "Reply with the single word OK."}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status), json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


def start(tmp_path: Path, *, driver: str | None, fault: str | None, cuda: str = "13.0.2") -> Server | str:
    """The entrypoint as a process: a Server once it listens, or its whole output once it has exited."""
    proc_dir = tmp_path / "proc"
    if driver is not None:
        (proc_dir / "driver" / "nvidia").mkdir(parents=True)
        (proc_dir / "driver" / "nvidia" / "version").write_text(driver)
    knob = tmp_path / "serve-fault"
    if fault is not None:
        knob.write_text(fault + "\n")
    port = free_port()
    env = dict(os.environ, NVIDIA_SIM_PROC=str(proc_dir), NVIDIA_SIM_SERVE_FAULT=str(knob), CUDA_VERSION=cuda,
               VLLM_VERSION="0.27.1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(SERVE), "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size",
                             "8", "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Application startup complete." in line:
            return Server(proc, port)
    proc.wait(30)
    return f"rc={proc.returncode}\n" + "".join(lines)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        s.proc.terminate()
        s.proc.wait(30)


def test_a_good_node_serves(tmp_path: Path, servers: list[Server]) -> None:
    server = start(tmp_path, driver=LINE_580, fault=None)
    assert isinstance(server, Server), server
    servers.append(server)
    assert server.get("/health") == 200
    assert server.get("/v1/models") == 200
    status, body = server.chat()
    assert status == 200 and body["choices"], body
    server.proc.terminate()
    out, _ = server.proc.communicate(timeout=30)
    assert server.proc.returncode == 0 and "Shutting down" in out


def test_http500_knob_answers_every_chat_with_500(tmp_path: Path, servers: list[Server]) -> None:
    server = start(tmp_path, driver=LINE_580, fault="http500")
    assert isinstance(server, Server), server
    servers.append(server)
    assert server.get("/health") == 200
    status, body = server.chat()
    assert status == 500
    assert "testbed fault knob http500" in json.dumps(body)


def test_unready_knob_keeps_health_at_503(tmp_path: Path, servers: list[Server]) -> None:
    server = start(tmp_path, driver=LINE_580, fault="unready")
    assert isinstance(server, Server), server
    servers.append(server)
    assert server.get("/health") == 503
    assert server.get("/v1/models") == 200


@pytest.mark.parametrize(("driver", "fault", "cuda", "says"), [
    (LINE_580, "exit", "13.0.2", "RuntimeError: Engine core initialization failed (testbed fault knob exit)"),
    (None, None, "13.0.2", "RuntimeError: No CUDA GPUs are available"),
    (LINE_575, None, "13.0.2", "The NVIDIA driver on your system is too old (found version 12090)"),
    (LINE_580, "explode", "13.0.2", "unknown fault 'explode'"),
])
def test_a_server_that_cannot_start_says_why_and_exits(tmp_path: Path, driver: str | None, fault: str | None,
                                                       cuda: str, says: str) -> None:
    out = start(tmp_path, driver=driver, fault=fault, cuda=cuda)
    assert isinstance(out, str), "the server started"
    assert out.startswith(("rc=1\n", "rc=2\n")), out
    assert "vLLM API server version 0.27.1" in out and says in out


# -- the readiness wait k3_verify runs on the node ------------------------------------------------


class Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health() -> Iterator[tuple[str, type[Health]]]:
    handler = type("H", (Health,), {"status": 200})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/health", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def fake_runtime(tmp_path: Path, inspect: str | None) -> str:
    """A `podman` whose `inspect NAME` prints ``inspect`` (None: the container does not exist)."""
    state = tmp_path / "inspect.json"
    if inspect is not None:
        state.write_text(inspect)
    script = tmp_path / "podman"
    script.write_text(f"#!/bin/sh\n[ -f {state} ] || {{ echo 'Error: no such container k3fleet-smoke' >&2; "
                      f"exit 125; }}\ncat {state}\n")
    script.chmod(0o755)
    return str(script)


def inspect_json(status: str, code: int = 0) -> str:
    # The fields docker, podman and nerdctl share in `inspect`'s State.
    return json.dumps([{"Id": "abc", "State": {"Status": status, "Running": status == "running", "ExitCode": code}}])


def test_wait_ends_when_health_answers_200(wait_mod: ModuleType, tmp_path: Path,
                                           health: tuple[str, type[Health]]) -> None:
    url, _ = health
    out = wait_mod.wait(fake_runtime(tmp_path, inspect_json("running")), "k3fleet-smoke", url, 30, 0.1)
    assert out["ready"] is True and out["state"] == "running" and out["last"] == "HTTP 200"


@pytest.mark.parametrize("status", ["exited", "stopped"])  # podman: "stopped" until its cleanup ran
def test_wait_ends_at_once_when_the_container_stops(wait_mod: ModuleType, tmp_path: Path,
                                                    health: tuple[str, type[Health]], status: str) -> None:
    url, handler = health
    handler.status = 503
    out = wait_mod.wait(fake_runtime(tmp_path, inspect_json(status, 1)), "k3fleet-smoke", url, 3600, 0.1,
                        sleep=lambda s: pytest.fail("waited although the container had stopped"))
    assert out == {"ready": False, "state": "exited (exit code 1)", "waited_s": out["waited_s"],
                   "last": "no answer yet", "timed_out": False}


def test_wait_for_a_container_that_is_gone(wait_mod: ModuleType, tmp_path: Path,
                                           health: tuple[str, type[Health]]) -> None:
    url, _ = health
    out = wait_mod.wait(fake_runtime(tmp_path, None), "k3fleet-smoke", url, 3600, 0.1)
    assert out["ready"] is False and out["state"].startswith("gone (Error: no such container")


def test_wait_is_bounded(wait_mod: ModuleType, tmp_path: Path, health: tuple[str, type[Health]]) -> None:
    url, handler = health
    handler.status = 503
    ticks = iter(range(0, 10_000, 7))
    slept: list[float] = []
    out = wait_mod.wait(fake_runtime(tmp_path, inspect_json("running")), "k3fleet-smoke", url, 30, 5,
                        clock=lambda: float(next(ticks)), sleep=slept.append)
    # Clock readings 0, 7, 14, ...: the wait gives up at the first reading at or past the bound.
    assert out["ready"] is False and out["timed_out"] is True and out["last"] == "HTTP 503"
    assert out["waited_s"] == 35.0 and slept == [5] * 4


def test_wait_keeps_polling_while_starting(wait_mod: ModuleType, tmp_path: Path,
                                           health: tuple[str, type[Health]]) -> None:
    url, _ = health
    runtime = fake_runtime(tmp_path, inspect_json("created"))

    def now_running(_: float) -> None:
        Path(tmp_path / "inspect.json").write_text(inspect_json("running"))

    out = wait_mod.wait(runtime, "k3fleet-smoke", url, 30, 0.1, sleep=now_running)
    assert out["ready"] is True


def test_wait_runs_as_the_role_runs_it(tmp_path: Path, health: tuple[str, type[Health]]) -> None:
    """`python3 -c <file> RUNTIME NAME URL TIMEOUT POLL`, one JSON line, exit status 0."""
    url, _ = health
    done = subprocess.run([sys.executable, "-c", WAIT.read_text(), fake_runtime(tmp_path, inspect_json("running")),
                           "k3fleet-smoke", url, "30", "1"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ready"] is True


# -- the serving layer of the testbed's images ------------------------------------------------------


def test_the_layer_carries_the_simulator_and_what_it_imports_only() -> None:
    closure = podman.serve_closure()
    tops = {rel.split("/", 1)[0] for rel in closure}
    assert {"k3fleet", "aiohttp", "pydantic", "pydantic_core", "prometheus_client"} <= tops
    ours = sorted(rel for rel in closure if rel.startswith("k3fleet/"))
    assert "k3fleet/lab/vllm_sim/server.py" in ours
    # Not the controller: the simulator's modules and the packages above them only.
    assert all(rel.startswith("k3fleet/lab/vllm_sim/") or rel in ("k3fleet/__init__.py", "k3fleet/lab/__init__.py")
               for rel in ours), ours
    # Nothing of the standard library (the image's python3 has its own).
    assert not tops & {"asyncio", "json", "encodings"} and not any(t.startswith("_sysconfigdata") for t in tops)
    assert not any("__pycache__" in rel or rel.endswith(".pyc") for rel in closure)


def test_the_image_tar_is_the_rootfs_with_the_layer_on_top(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        for name in ("./usr", "./usr/local", "./usr/local/bin", "./opt", "./etc"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        data = b"bookworm\n"
        info = tarfile.TarInfo("./etc/debian_version")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    layer = podman.serve_layer({"k3fleet/__init__.py": ROOT / "k3fleet" / "__init__.py"})
    out = tmp_path / "image.tar"
    podman.write_image_tar(rootfs, layer, out)
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile("./etc/debian_version").read() == b"bookworm\n"  # type: ignore[union-attr]
        wrapper = members["." + podman.SERVE_COMMAND]
        assert wrapper.mode == 0o755
        text = tar.extractfile(wrapper).read().decode()  # type: ignore[union-attr]
        assert f"PYTHONPATH={podman.SERVE_SITE} exec python3 {podman.SERVE_SITE}/vllm_serve.py" in text
        assert members[f".{podman.SERVE_SITE}/vllm_serve.py"].mode == 0o644
        assert f".{podman.SERVE_SITE}/k3fleet/__init__.py" in members
        # Every directory once: the rootfs's own are not added again.
        names = [m.name for m in tar.getmembers()]
        assert len(names) == len(set(names))
        assert members[f".{podman.SERVE_SITE}"].isdir()


def test_the_layer_key_follows_the_content() -> None:
    layer = podman.serve_layer({"k3fleet/__init__.py": ROOT / "k3fleet" / "__init__.py"})
    key = podman.layer_key(layer)
    assert podman.layer_key(dict(layer)) == key
    changed = dict(layer)
    changed[podman.SERVE_COMMAND] = (layer[podman.SERVE_COMMAND][0] + b"# changed\n", 0o755)
    assert podman.layer_key(changed) != key
