"""Parent of every sshd of the SSH lab fleet.

Run detached by `up` on SPEC.json (`python -m k3fleet.lab.sshfleet.supervisor SPEC.json` by hand). It

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
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from k3fleet.lab.common import supervise

MODULE = "k3fleet.lab.sshfleet.supervisor"
LABEL = "ssh-fleet supervisor"
STOP_GRACE = 5.0
READY_TIMEOUT = 60.0


class Supervisor(supervise.BaseSupervisor):
    label = LABEL

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.mark_env = str(spec["mark_env"])
        self.workdir = str(spec["workdir"])
        self.log_file = Path(spec["log_file"])
        self.daemons: list[dict[str, Any]] = list(spec["daemons"])
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.exits: dict[str, int] = {}
        self.by_pid: dict[int, str] = {}

    def live_view(self) -> dict[str, Any]:
        return {"sshd": {name: {"pid": p.pid, "running": name not in self.exits, "exit": self.exits.get(name)}
                         for name, p in self.procs.items()}}

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
        for pid, code in supervise.exited_children():
            name = self.by_pid.pop(pid, None)
            if name is None:
                continue
            self.exits[name] = code
            self.procs[name].returncode = code
            changed = True
            if not self.stopping:
                self.log(f"sshd of {name} (pid {pid}) exited with {code}")
        return changed

    def stop_children(self) -> None:
        # All at once; the sessions of a killed listener are adopted orphans, killed after this.
        live = [p for name, p in self.procs.items() if name not in self.exits]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and len(self.exits) < len(self.procs):
            self.reap()
            time.sleep(0.05)

    def start_children(self) -> None:
        self.start_all()
        self.write_live()
        self.wait_ready()

    def tick(self) -> None:
        if self.reap():
            self.write_live()


def main(argv: list[str] | None = None) -> int:
    return supervise.main(argv, module=MODULE, label=LABEL, run=lambda spec: Supervisor(spec).run())


if __name__ == "__main__":
    sys.exit(main())
