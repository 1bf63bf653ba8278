"""Safe writes and bounded inputs, as tables run through the real CLI (docs/safety.md "Writes",
"Bounds").

Writes: ``report --out`` and ``decide --archive`` pointed at a symlink, a FIFO, a character device
(as root), an input run's own file, an existing file, a directory and paths under /proc are each
refused in one line, exit 2, with nothing changed (bytes, inode and lstat compared) and no
temporary file left; ``--force`` replaces a regular file and nothing else.

Bounds: devices, FIFOs, a gzip bomb, an oversize file, an oversize ``/v1/models`` body and
``/metrics`` page and a server that trickles one byte every 0.2 s each end in one line with exit
2 or 3, and the child's peak memory (its own rusage, from wait4) stays under 300 MB. Seconds
options that are inf, nan or 1e400 are refused at once. A generous timeout guards against hangs;
nothing is timed.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import socket
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.diskfull import disk_full_on
from tests.unit.accept_servers import loopback

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
K3FLEET = str(BIN / "k3fleet")
FIX = Path(__file__).resolve().parents[1] / "fixtures"
MEMORY_LIMIT_KB = 300 * 1024
HANG_GUARD_S = 180.0
ROOT = os.geteuid() == 0


@dataclass
class Ran:
    rc: int
    stdout: str
    stderr: str
    maxrss_kb: int

    def one_line(self) -> str:
        """The single error line on stderr (and nothing that looks like a traceback)."""
        assert "Traceback" not in self.stderr, self.stderr[-3000:]
        errors = [line for line in self.stderr.splitlines() if line.startswith("k3fleet: error:")]
        assert len(errors) == 1, self.stderr[-3000:]
        return errors[0]


def k3fleet(*args: str, tmp: Path, env: dict[str, str] | None = None) -> Ran:
    """Run the CLI, reap it with wait4 for its own peak RSS, kill it if it outlives the hang guard."""
    out, err = tmp / f".stdout-{time.monotonic_ns()}", tmp / f".stderr-{time.monotonic_ns()}"
    full_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "250",
                **(env or {})}
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen([K3FLEET, *args], stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=full_env,
                                cwd=tmp)
    guard = time.monotonic() + HANG_GUARD_S
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > guard:
            proc.kill()
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            pytest.fail(f"k3fleet {' '.join(args)} still running after {HANG_GUARD_S} s")
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    ran = Ran(proc.returncode, out.read_text(errors="replace"), err.read_text(errors="replace"), usage.ru_maxrss)
    out.unlink()
    err.unlink()
    return ran


def snapshot(path: Path) -> tuple[object, ...] | None:
    """What must not change: the lstat identity, a link's target, a regular file's bytes."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if str(path).startswith("/proc/"):
        return (st.st_mode,)  # the kernel's file: its bytes change by themselves
    extra: object = None
    if stat.S_ISLNK(st.st_mode):
        extra = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        extra = path.read_bytes()
    return (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, extra)


def no_temp_files(*dirs: Path) -> None:
    for d in dirs:
        if d.is_dir():
            left = [p.name for p in d.iterdir() if p.name.endswith(".tmp")]
            assert left == [], left


@pytest.fixture(scope="module")
def triage_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bounds")
    run = root / "triage"
    ran = k3fleet("triage", str(FIX / "triage" / "fm_journal_nothing_to_do.txt"), "--host", "gpu-x01",
                  "--out", str(run), tmp=root)
    assert ran.rc in (0, 1), ran.stderr
    assert (run / "manifest.json").is_file() and (run / "report.md").is_file()
    return run


# -- writes -----------------------------------------------------------------------------------------


def _symlink(tmp: Path) -> Path:
    target = tmp / "target.md"
    target.write_text("the link's target\n")
    (tmp / "link.md").symlink_to(target)
    return tmp / "link.md"


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


def _chardev(tmp: Path) -> Path:
    if not ROOT:
        pytest.skip("making a character device needs root")
    os.mknod(tmp / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return tmp / "null"


def _existing(tmp: Path) -> Path:
    (tmp / "old.out").write_bytes(b"an unrelated file that must survive\n")
    return tmp / "old.out"


def _directory(tmp: Path) -> Path:
    (tmp / "adir").mkdir()
    return tmp / "adir"


# (case, destination maker, whether --force is passed, the line's text)
WRITE_CASES: list[tuple[str, Callable[[Path], Path], bool, str]] = [
    ("symlink", _symlink, False, "is a symbolic link"),
    ("symlink, forced", _symlink, True, "is a symbolic link"),
    ("/dev/stdout", lambda _t: Path("/dev/stdout"), True, "is a symbolic link"),
    ("fifo", _fifo, True, "is a FIFO"),
    ("character device", _chardev, True, "is a character device"),
    ("existing file", _existing, False, "exists: pass --force to replace it"),
    ("directory", _directory, True, "is a directory"),
    ("under /proc", lambda _t: Path("/proc/self/status"), True, "is under /proc"),
    ("new file under /proc", lambda _t: Path("/proc/k3fleet-bounds-test.out"), True, "is under /proc"),
    ("no such directory", lambda t: t / "missing" / "x.out", False, "does not exist"),
]


@pytest.mark.parametrize(("case", "make", "force", "expected"), WRITE_CASES, ids=[c[0] for c in WRITE_CASES])
@pytest.mark.parametrize("command", ["report", "decide"])
def test_bad_destinations_are_refused_and_left_alone(tmp_path: Path, triage_run: Path, command: str, case: str,
                                                     make: Callable[[Path], Path], force: bool,
                                                     expected: str) -> None:
    dest = make(tmp_path)
    before = snapshot(dest)
    follow = snapshot(tmp_path / "target.md")
    decision = tmp_path / "decision"
    if command == "report":
        args = ["report", str(triage_run), "--out", str(dest)]
    else:
        args = ["decide", str(triage_run), "--reviewer", "carol", "--out", str(decision), "--archive", str(dest)]
    ran = k3fleet(*args, *(["--force"] if force else []), tmp=tmp_path)
    assert ran.rc == 2, ran.stderr
    line = ran.one_line()
    assert expected in line and str(dest) in line, line
    assert snapshot(dest) == before
    assert snapshot(tmp_path / "target.md") == follow
    assert not decision.exists()  # refused before the decision's run directory was made
    no_temp_files(tmp_path, dest.parent)


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("command", ["report", "decide"])
def test_a_file_inside_an_input_run_is_refused_even_with_force(tmp_path: Path, triage_run: Path, command: str,
                                                               force: bool) -> None:
    own = triage_run / "report.md"
    before = snapshot(own)
    flag = "--out" if command == "report" else "--archive"
    args = (["report", str(triage_run), "--out", str(own)] if command == "report" else
            ["decide", str(triage_run), "--reviewer", "carol", "--out", str(tmp_path / "d"), "--archive", str(own)])
    ran = k3fleet(*args, *(["--force"] if force else []), tmp=tmp_path)
    assert ran.rc == 2
    assert f"{flag} {own} is inside {triage_run}, a run directory this command reads" in ran.one_line()
    assert snapshot(own) == before
    new = triage_run / "new.tar.gz"
    ran = k3fleet("decide", str(triage_run), "--reviewer", "carol", "--out", str(tmp_path / "d2"), "--archive",
                  str(new), tmp=tmp_path)
    assert ran.rc == 2 and "a run directory this command reads" in ran.one_line()
    assert not new.exists()
    assert k3fleet("verify", str(triage_run), tmp=tmp_path).rc == 0
    no_temp_files(triage_run)


def test_force_replaces_a_regular_file_and_dash_is_stdout(tmp_path: Path, triage_run: Path) -> None:
    dest = _existing(tmp_path)
    ran = k3fleet("report", str(triage_run), "--out", str(dest), "--force", tmp=tmp_path)
    assert ran.rc == 0, ran.stderr
    assert dest.read_text().startswith("# k3fleet triage") and oct(dest.stat().st_mode & 0o777) == "0o644"
    archive = tmp_path / "old.tar.gz"
    archive.write_bytes(b"an older package\n")
    ran = k3fleet("decide", str(triage_run), "--reviewer", "carol", "--out", str(tmp_path / "d"), "--archive",
                  str(archive), "--force", tmp=tmp_path)
    assert ran.rc in (0, 1), ran.stderr
    assert archive.read_bytes()[:2] == b"\x1f\x8b"
    ran = k3fleet("report", str(triage_run), "--out", "-", tmp=tmp_path)
    assert ran.rc == 0 and ran.stdout == dest.read_text()
    ran = k3fleet("decide", str(triage_run), "--reviewer", "carol", "--out", str(tmp_path / "d3"), "--archive", "-",
                  tmp=tmp_path)
    assert ran.rc == 2 and "an evidence package is written to a file" in ran.one_line()
    no_temp_files(tmp_path)


# -- bounded files ----------------------------------------------------------------------------------


def _gzip_zeros(path: Path, megabytes: int) -> Path:
    """A gzip bomb: ``megabytes`` MiB of zeros compress to about a thousandth."""
    block = bytes(1 << 20)
    with gzip.GzipFile(path, "wb", compresslevel=6, mtime=0) as gz:
        for _ in range(megabytes):
            gz.write(block)
    return path


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def _tar_bomb(path: Path, megabytes: int) -> Path:
    """An evidence-package look-alike whose one member is ``megabytes`` MiB of zeros."""
    size = megabytes << 20
    with gzip.GzipFile(path, "wb", compresslevel=6, mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        info = tarfile.TarInfo("d-1/PACKAGE.json")
        info.size = size
        tar.addfile(info, io.BufferedReader(_Zeros(size)))
    return path


def _sparse(path: Path, megabytes: int) -> Path:
    with path.open("wb") as fh:
        fh.truncate(megabytes << 20)
    return path


# (case, argv maker given tmp, exit code, text of the line)
FILE_CASES: list[tuple[str, Callable[[Path], list[str]], int, str]] = [
    ("startup --log /dev/zero", lambda _t: ["accept", "startup", "--log", "/dev/zero"], 2,
     "start-up log /dev/zero is a character device, not a text log"),
    ("accept all --log /dev/zero", lambda _t: ["accept", "all", "--base-url", "http://127.0.0.1:9", "--model", "m",
                                               "--log", "/dev/zero"], 2, "--log /dev/zero is a character device"),
    ("triage /dev/zero", lambda _t: ["triage", "/dev/zero"], 2, "/dev/zero is a character device"),
    ("triage /dev/urandom", lambda _t: ["triage", "/dev/urandom"], 2, "/dev/urandom is a character device"),
    ("triage a FIFO", lambda t: ["triage", str(_fifo(t))], 2, "is a FIFO, not a pasted capture"),
    ("startup --log a FIFO", lambda t: ["accept", "startup", "--log", str(_fifo(t))], 2, "is a FIFO"),
    ("startup --log a gzip bomb", lambda t: ["accept", "startup", "--log", str(_gzip_zeros(t / "vllm.log.gz", 200))],
     2, "gzip data with more than 134217728 bytes decompressed: too large for a text log (limit 134217728 bytes; "
        "K3FLEET_MAX_LOG_BYTES raises it)"),
    ("triage a gzip bomb", lambda t: ["triage", str(_gzip_zeros(t / "smi.txt.gz", 200))], 2,
     "too large for a pasted capture"),
    ("triage an oversize file", lambda t: ["triage", str(_sparse(t / "big.txt", 200))], 2,
     "is 209715200 bytes: too large for a pasted capture (limit 67108864 bytes; K3FLEET_MAX_CAPTURE_BYTES raises it)"),
    ("verify-evidence of a tar bomb", lambda t: ["verify-evidence", str(_tar_bomb(t / "p.tar.gz", 200))], 2,
     "member d-1/PACKAGE.json is 209715200 bytes decompressed: too large for an evidence package"),
]


@pytest.mark.parametrize(("case", "argv", "rc", "expected"), FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bounded_file_inputs(tmp_path: Path, case: str, argv: Callable[[Path], list[str]], rc: int,
                             expected: str) -> None:
    ran = k3fleet(*argv(tmp_path), tmp=tmp_path)
    assert ran.rc == rc, ran.stderr
    assert expected in ran.one_line()
    assert ran.maxrss_kb < MEMORY_LIMIT_KB, f"peak RSS {ran.maxrss_kb} kB"


def test_a_long_vllm_log_is_triaged_and_redacted_in_bounded_memory(tmp_path: Path) -> None:
    """A 24 MB vLLM log (the decide fixture's start-up, then a running server's routine lines and one
    planted token): judged and stored through the redactor a piece at a time. Folded word by word and
    redacted whole it peaked at about 13 times its size."""
    token = "hf_" + "Q" * 30
    routine = "".join(f"(APIServer pid=1) INFO 08-14 10:00:{i % 60:02d} [loggers.py:123] Engine 000: Avg prompt "
                      f"throughput: {i}.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.2%\n"
                      for i in range(1000))
    log = tmp_path / "vllm.log"
    with log.open("w") as fh:
        fh.write((FIX / "decide" / "startup_kimi_k3_tp8_dp2.log").read_text())
        while fh.tell() < 12 << 20:
            fh.write(routine)
        fh.write(f"(APIServer pid=1) INFO 08-14 10:01:00 [api_server.py:1] HF_TOKEN={token}\n")
        while fh.tell() < 24 << 20:
            fh.write(routine)
    ran = k3fleet("triage", "--out", str(tmp_path / "run"), str(log), tmp=tmp_path)
    assert ran.rc in (0, 1), ran.stderr
    assert ran.maxrss_kb < MEMORY_LIMIT_KB, f"peak RSS {ran.maxrss_kb} kB"
    stored = next((tmp_path / "run" / "inputs").iterdir())
    assert stored.stat().st_size > (24 << 20) - 1024
    assert token.encode() not in stored.read_bytes()


@pytest.mark.parametrize("flag", ["--owners", "--build", "--target"])
def test_decide_records_that_are_devices_or_fifos(tmp_path: Path, triage_run: Path, flag: str) -> None:
    for source in ("/dev/zero", str(_fifo(tmp_path))):
        ran = k3fleet("decide", str(triage_run), "--reviewer", "carol", flag, source, "--out", str(tmp_path / "d"),
                      tmp=tmp_path)
        assert ran.rc == 2, ran.stderr
        line = ran.one_line()
        assert source in line and (" is a character device" in line or " is a FIFO" in line), line
        assert ran.maxrss_kb < MEMORY_LIMIT_KB
        assert not (tmp_path / "d").exists()
        os.unlink(tmp_path / "fifo") if source.endswith("fifo") else None


def test_a_cap_is_raised_by_its_variable(tmp_path: Path) -> None:
    log = tmp_path / "startup.log.gz"
    with gzip.GzipFile(log, "wb", mtime=0) as gz:
        gz.write((FIX / "vllm_startup" / "oom_load_model.log").read_bytes())
    ran = k3fleet("accept", "startup", "--log", str(log), tmp=tmp_path, env={"K3FLEET_MAX_LOG_BYTES": "1K"})
    assert ran.rc == 2 and "limit 1024 bytes; K3FLEET_MAX_LOG_BYTES raises it" in ran.one_line()
    ran = k3fleet("accept", "startup", "--log", str(log), "--json", tmp=tmp_path)
    assert ran.rc in (0, 1, 3) and json.loads(ran.stdout)["probe"] == "startup", ran.stderr
    ran = k3fleet("accept", "startup", "--log", str(log), tmp=tmp_path, env={"K3FLEET_MAX_LOG_BYTES": "lots"})
    assert ran.rc == 2 and "K3FLEET_MAX_LOG_BYTES='lots'" in ran.one_line()


# -- bounded HTTP -------------------------------------------------------------------------------------

_MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()


class _Handler(BaseHTTPRequestHandler):
    mode = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        return

    def _endless(self, ctype: str, piece: bytes) -> None:
        """A chunked body that never ends: the client must stop reading at its cap."""
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        try:
            for _ in range(1 << 14):  # 1 GiB at most, should the client never stop
                self.wfile.write(chunk)
        except OSError:
            pass
        self.close_connection = True

    def _trickle(self) -> None:
        """Headers and body one byte every 0.2 s: every read is quick, the whole answer never is."""
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n" +
                b'{"object": "list", "data": [' + b" " * 99000)
        try:
            for byte in head[:600]:  # two minutes at most
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass
        self.close_connection = True

    def do_GET(self) -> None:
        mode = type(self).mode
        if mode == "trickle":
            self._trickle()
        elif self.path == "/v1/models" and mode == "models_declared":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(400 << 20))
            self.end_headers()
            self.close_connection = True
        elif self.path == "/v1/models" and mode == "models_endless":
            self._endless("application/json", b'{"id": "m", "object": "model"},' * 2048)
        elif self.path == "/v1/models":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(_MODELS)))
            self.end_headers()
            self.wfile.write(_MODELS)
        elif self.path == "/metrics" and mode == "metrics_endless":
            self._endless("text/plain; version=0.0.4",
                          b"".join(b'vllm:filler_total{model_name="m",n="%d"} 1\n' % i for i in range(1500)))
        else:
            body = b'{"detail": "Not Found"}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


@contextmanager
def server(mode: str) -> Iterator[str]:
    with loopback(type("Handler", (_Handler,), {"mode": mode})) as url:
        yield url


def test_the_trickle_server_really_trickles() -> None:
    """The stand-in is what it claims: bytes keep coming, each read well inside any read timeout."""
    with server("trickle") as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while len(got) < 5:
                got += s.recv(16)
            assert got.startswith(b"HTTP/")


HTTP_CASES: list[tuple[str, list[str], str]] = [
    ("models_declared", [], "/v1/models answered more than the 8388608-byte limit for the /v1/models and /version "
                            "bodies (it announced 419430400 bytes; K3FLEET_MAX_MODELS_BYTES raises it)"),
    ("models_endless", [], "/v1/models answered more than the 8388608-byte limit for the /v1/models and /version "
                           "bodies (stopped after"),
    ("trickle", ["--timeout", "2"], "/v1/models did not answer in full within 2 s (one deadline for the whole "
                                    "request: connect, headers and body;"),
]


@pytest.mark.parametrize(("mode", "extra", "expected"), HTTP_CASES, ids=[c[0] for c in HTTP_CASES])
def test_bounded_http_bodies_and_deadlines(tmp_path: Path, mode: str, extra: list[str], expected: str) -> None:
    with server(mode) as url:
        ran = k3fleet("accept", "prefix-cache", "--base-url", url, "--model", "m", *extra, tmp=tmp_path)
    assert ran.rc == 3, ran.stderr
    line = ran.one_line()
    assert expected in line and url in line, line
    assert ran.maxrss_kb < MEMORY_LIMIT_KB, f"peak RSS {ran.maxrss_kb} kB"


def test_an_endless_metrics_page_stops_at_its_cap(tmp_path: Path) -> None:
    with server("metrics_endless") as url:
        ran = k3fleet("accept", "all", "--base-url", url, "--model", "m", "--skip", "prefix_cache", "--skip", "agent",
                      "--skip", "load", "--quiet", "--json", "--out", str(tmp_path / "run"), tmp=tmp_path)
    assert ran.rc == 3, ran.stderr
    assert "Traceback" not in ran.stderr
    server_info = json.loads((tmp_path / "run" / "accept.json").read_text())["server"]
    assert server_info["metrics_error"].startswith(
        f"{url}/metrics answered more than the 16777216-byte limit for one /metrics page (stopped after")
    assert ran.maxrss_kb < MEMORY_LIMIT_KB, f"peak RSS {ran.maxrss_kb} kB"


# -- durations ----------------------------------------------------------------------------------------

DURATION_CASES: list[tuple[list[str], str]] = [
    (["watch", "--base-url", "http://127.0.0.1:9", "--baseline", "/nonexistent", "--for", "inf"],
     "--for 'inf' is not a finite number of seconds"),
    (["watch", "--base-url", "http://127.0.0.1:9", "--baseline", "/nonexistent", "--for", "1e400"],
     "--for '1e400' is not a finite number of seconds"),
    (["watch", "--base-url", "http://127.0.0.1:9", "--baseline", "/nonexistent", "--for", "nan"],
     "--for 'nan' is not a finite number of seconds"),
    (["watch", "--base-url", "http://127.0.0.1:9", "--baseline", "/nonexistent", "--for", "8d"],
     "--for '8d' is above the maximum of 7d"),
    (["watch", "--base-url", "http://127.0.0.1:9", "--baseline", "/nonexistent", "--interval", "inf"],
     "--interval 'inf' is not a finite number of seconds"),
    (["accept", "all", "--base-url", "http://127.0.0.1:9", "--model", "m", "--load-option",
      "max_duration_s=Infinity"], "--load-option max_duration_s: Input should be a finite number"),
    (["accept", "load", "--base-url", "http://127.0.0.1:9", "--model", "m", "--max-duration", "nan"],
     "--max-duration 'nan' is not a finite number of seconds"),
    (["accept", "prefix-cache", "--base-url", "http://127.0.0.1:9", "--model", "m", "--timeout", "1e400"],
     "--timeout '1e400' is not a finite number of seconds"),
    (["audit", "--lab", "--command-timeout", "-1"], "--command-timeout '-1' must be at least 0.1s"),
]


@pytest.mark.parametrize(("argv", "expected"), DURATION_CASES, ids=[" ".join(c[0][:2] + c[0][-2:])
                                                                    for c in DURATION_CASES])
def test_durations_are_finite_and_bounded(tmp_path: Path, argv: list[str], expected: str) -> None:
    ran = k3fleet(*argv, tmp=tmp_path)
    assert ran.rc == 2, ran.stderr
    assert expected in ran.one_line()
    assert not (tmp_path / "runs").exists()


def test_a_disk_that_fills_while_the_archive_is_written(tmp_path: Path, triage_run: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """ENOSPC on the package's temporary file: exit 3, one line, the old archive untouched, no temp file."""
    from k3fleet.cli import main

    archive = tmp_path / "decision.tar.gz"
    archive.write_bytes(b"the previous package")
    disk_full_on(monkeypatch, ".decision.tar.gz.")
    rc = main(["decide", str(triage_run), "--reviewer", "carol", "--out", str(tmp_path / "d"), "--archive",
               str(archive), "--force"])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "Traceback" not in err
    assert (f"k3fleet: error: cannot write --archive {archive}: No space left on device: the disk filled "
            "mid-write; nothing was replaced") in err
    assert archive.read_bytes() == b"the previous package"
    no_temp_files(tmp_path)


def test_the_default_archive_beside_out_is_judged_before_anything_is_written(tmp_path: Path,
                                                                             triage_run: Path) -> None:
    beside = tmp_path / "d.tar.gz"
    beside.write_bytes(b"last week's package")
    ran = k3fleet("decide", str(triage_run), "--reviewer", "carol", "--out", str(tmp_path / "d"), tmp=tmp_path)
    assert ran.rc == 2
    assert f"evidence package {beside} exists: pass --force to replace it" in ran.one_line()
    assert beside.read_bytes() == b"last week's package" and not (tmp_path / "d").exists()
