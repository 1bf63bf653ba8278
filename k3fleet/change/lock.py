"""One change at a time per fleet state directory, and no play that outlives its controller
(docs/change-night.md "Lock").

``NightLock``: an exclusive ``flock`` on ``<runs dir>/.k3fleet/night.lock`` held for the whole
night, resume or rollback, with a JSON record of its holder (change id, operator, host, pid,
run). A second controller on the same state directory is refused with that record. The kernel
drops the lock when the holder dies, however it dies.

``PlayGuard``: ansible-playbook is started through a small launcher that makes it die with the
controller (``PR_SET_PDEATHSIG``; and SIGHUP back to its default, so that its workers go with
it when its terminal closes) and records its pid. A play whose pid file names a live
ansible-playbook is an orphan of a controller that was killed before the guard was in place
(or on a system without ``prctl``): nothing starts on the same state directory until it ends.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import getpass
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from k3fleet.bounds import loads_json, read_bounded
from k3fleet.errors import UsageError

STATE_DIR = ".k3fleet"
LOCK_FILE = "night.lock"
PLAYS_DIR = "plays"

# The launcher ansible-runner starts instead of ansible-playbook. Linux only (prctl); elsewhere
# it still records the pid, so an orphan is at least refused.
_LAUNCHER = '''#!{python}
import ctypes, json, os, signal, sys
PR_SET_PDEATHSIG = 1
try:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
except (OSError, AttributeError):
    pass
# ansible-runner starts the play with SIGHUP ignored; restored, the play's workers end with it.
signal.signal(signal.SIGHUP, signal.SIG_DFL)
if os.getppid() != {controller}:
    sys.exit("k3fleet: the controller ended before the play started")
with open({pidfile!r} + ".tmp", "w") as fh:
    json.dump({{"pid": os.getpid(), "start": open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19],
               "run": {run!r}}}, fh)
os.replace({pidfile!r} + ".tmp", {pidfile!r})
os.execv({real!r}, [{real!r}] + sys.argv[1:])
'''


def state_dir(runs_dir: Path) -> Path:
    return runs_dir / STATE_DIR


def _proc_start(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def live_plays(runs_dir: Path) -> list[dict[str, Any]]:
    """Plays recorded under the state directory whose ansible-playbook still runs."""
    found: list[dict[str, Any]] = []
    plays = state_dir(runs_dir) / PLAYS_DIR
    if not plays.is_dir():
        return found
    for pidfile in sorted(plays.glob("*/pid.json")):
        try:
            # Bounded: a FIFO or a device planted as a record is skipped, never waited on.
            rec = loads_json(read_bounded(pidfile, "run_json").decode("utf-8"))
            pid, start = int(rec["pid"]), str(rec["start"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        # The same pid with the same start time, still an ansible-playbook: not a reused pid.
        if _proc_start(pid) == start and any("ansible-playbook" in a for a in _cmdline(pid)[:3]):
            found.append({"pid": pid, "run": rec.get("run"), "dir": str(pidfile.parent)})
        else:
            shutil.rmtree(pidfile.parent, ignore_errors=True)
    return found


class NightLock:
    """The state directory's lock (a context manager); ``holder`` is recorded for whoever comes next."""

    def __init__(self, runs_dir: Path, *, kind: str, change_id: str | None, operator: str | None) -> None:
        self.runs_dir = runs_dir
        self.path = state_dir(runs_dir) / LOCK_FILE
        self.record: dict[str, Any] = {
            "kind": kind, "change_id": change_id, "operator": operator or _user(), "host": socket.gethostname(),
            "pid": os.getpid(), "since": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "run": None}
        self.fd: int | None = None

    def __enter__(self) -> NightLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UsageError(f"cannot open the lock {self.path}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_record(fd)
            os.close(fd)
            raise UsageError(f"{self.runs_dir} is in use by {_describe(holder)}: one change at a time per runs "
                             "directory; wait for it to end") from None
        self.fd = fd
        orphans = live_plays(self.runs_dir)
        if orphans:
            self.__exit__(None, None, None)
            o = orphans[0]
            raise UsageError(f"an ansible-playbook of run {o['run']} still runs as pid {o['pid']} (its controller "
                             f"is gone): wait for it to end or stop it (kill {o['pid']}), then run this again")
        self._write()
        return self

    def set_run(self, run_dir: Path) -> None:
        self.record["run"] = str(run_dir)
        self._write()

    def _write(self) -> None:
        assert self.fd is not None
        data = (json.dumps(self.record) + "\n").encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        os.fsync(self.fd)

    def __exit__(self, *exc: object) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def _read_record(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 1 << 16, 0)
        data = json.loads(raw.decode() or "{}")
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another k3fleet process (its record cannot be read)"
    what = holder.get("kind") or "change"
    cid = f" {holder['change_id']}" if holder.get("change_id") else ""
    run = f", run {holder['run']}" if holder.get("run") else ""
    return (f"{what}{cid} of {holder.get('operator') or '?'} on {holder.get('host') or '?'} "
            f"(pid {holder.get('pid') or '?'}, since {holder.get('since') or '?'}{run})")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


class PlayGuard:
    """The launcher for one play (a context manager): while it is open, ``ansible-playbook`` on this
    process's PATH is the launcher, which ansible-runner then starts instead of the real one."""

    def __init__(self, runs_dir: Path, run_id: str, real: str) -> None:
        self.dir = state_dir(runs_dir) / PLAYS_DIR / run_id
        self.real = real
        self.run_id = run_id
        self._path: str | None = None

    def __enter__(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        launcher = self.dir / "ansible-playbook"
        launcher.write_text(_LAUNCHER.format(python=sys.executable, controller=os.getpid(), real=self.real,
                                             pidfile=str(self.dir / "pid.json"), run=self.run_id))
        launcher.chmod(0o755)
        self._path = os.environ.get("PATH", "")
        # The real one's directory right after the launcher: the runner puts it first otherwise.
        os.environ["PATH"] = os.pathsep.join([str(self.dir), str(Path(self.real).parent), self._path])
        return self.dir

    def __exit__(self, *exc: object) -> None:
        if self._path is not None:
            os.environ["PATH"] = self._path
            self._path = None
        shutil.rmtree(self.dir, ignore_errors=True)
