"""Parent of every sshd of the SSH lab fleet.

Run detached by `up` as `python -m k3fleet.lab.sshfleet.supervisor SPEC.json`. It

- becomes a child subreaper: this machine's PID 1 reaps nothing, so session processes left
  behind by an sshd (a ControlPersist session whose listener was killed) are reparented here
  and reaped here instead of staying <defunct>;
- starts every sshd at once, in the foreground (`sshd -D`), each inside its host's network
  namespace through `nsenter --net`, and writes a live view (pids, running, exits) for `status`
  and for the benchmark's node-side CPU accounting;
- does not restart an sshd that exits: the live view says so and the audit sees the host
  unreachable, which is what a dead sshd means;
- on SIGTERM/SIGINT stops all sshds at once, kills whatever else is left below it, exits 0.

Every child carries the MARK_ENV mark in its environment: after a SIGKILL of this process
`down` still finds the sshds, and their session children, by that mark.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
STOP_GRACE = 5.0
READY_TIMEOUT = 60.0


class Supervisor:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.mark_env = str(spec["mark_env"])
        self.workdir = str(spec["workdir"])
        self.live_file = Path(spec["live_file"])
        self.log_file = Path(spec["log_file"])
        self.daemons: list[dict[str, Any]] = list(spec["daemons"])
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.exits: dict[str, int] = {}
        self.by_pid: dict[int, str] = {}
        self.stopping = False
        self.phase = "starting"

    def log(self, message: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} ssh-fleet supervisor[{os.getpid()}]: {message}", flush=True)

    def write_live(self) -> None:
        data = {
            "pid": os.getpid(),
            "phase": self.phase,
            "updated": time.time(),
            "sshd": {name: {"pid": p.pid, "running": name not in self.exits, "exit": self.exits.get(name)}
                     for name, p in self.procs.items()},
        }
        fd, tmp = tempfile.mkstemp(prefix=".live-", dir=self.live_file.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, self.live_file)

    def start_all(self) -> None:
        env = dict(os.environ)
        env[self.mark_env] = self.workdir
        env["LC_ALL"] = "C"
        with open(self.log_file, "ab") as log:
            for daemon in self.daemons:
                if self.stopping:
                    return
                p = subprocess.Popen(daemon["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     env=env, cwd="/", close_fds=True)
                self.procs[daemon["name"]] = p
                self.by_pid[p.pid] = daemon["name"]
        self.log(f"started {len(self.procs)} sshd")

    def wait_ready(self) -> None:
        """Until every sshd wrote its pid file: sshd -D writes it after binding its socket."""
        pending = {d["name"]: Path(d["pid_file"]) for d in self.daemons}
        deadline = time.monotonic() + READY_TIMEOUT
        while pending and not self.stopping:
            self.reap()
            for name in list(pending):
                if pending[name].exists() or name in self.exits:
                    del pending[name]
            if time.monotonic() > deadline:
                self.log(f"not ready within {READY_TIMEOUT:.0f}s: {', '.join(sorted(pending))}")
                return
            time.sleep(0.05)

    def reap(self) -> bool:
        """Collect every exited child, ours or adopted; True when one of our sshds exited."""
        changed = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return changed
            if pid == 0:
                return changed
            name = self.by_pid.pop(pid, None)
            if name is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            self.exits[name] = code
            self.procs[name].returncode = code
            changed = True
            if not self.stopping:
                self.log(f"sshd of {name} (pid {pid}) exited with {code}")

    def _children(self) -> list[int]:
        me = os.getpid()
        kids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rfind(")") + 2 :].split()
            if len(fields) > 1 and int(fields[1]) == me and fields[0] != "Z":
                kids.append(int(entry))
        return kids

    def shutdown(self) -> None:
        self.phase = "stopping"
        self.write_live()
        live = [p for name, p in self.procs.items() if name not in self.exits]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and len(self.exits) < len(self.procs):
            self.reap()
            time.sleep(0.05)
        # Stragglers and adopted orphans (sessions of a killed listener): SIGKILL until none is left.
        for _ in range(50):
            self.reap()
            kids = self._children()
            if not kids:
                break
            for pid in kids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        self.reap()
        self.phase = "stopped"
        self.write_live()
        self.log("stopped")

    def request_stop(self, signum: int, _frame: object) -> None:
        self.stopping = True

    def run(self) -> int:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            self.log(f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}")
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.start_all()
        self.write_live()
        self.wait_ready()
        if not self.stopping:
            self.phase = "running"
            self.write_live()
        while not self.stopping:
            if self.reap():
                self.write_live()
            time.sleep(0.2)
        self.shutdown()
        return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m k3fleet.lab.sshfleet.supervisor SPEC.json", file=sys.stderr)
        return 2
    try:
        spec = json.loads(Path(args[0]).read_text())
    except (OSError, ValueError) as exc:
        print(f"ssh-fleet supervisor: cannot read spec {args[0]}: {exc}", file=sys.stderr)
        return 2
    return Supervisor(spec).run()


if __name__ == "__main__":
    sys.exit(main())
