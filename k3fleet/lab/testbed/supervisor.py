"""The testbed supervisor: parent of every daemon and guest, restarts guests that reboot.

Run detached by the harness on SPEC.json (`python -m k3fleet.lab.testbed.supervisor SPEC.json` by hand). It

- becomes a child subreaper, so processes that daemonize below it (slurmstepd, anything a job
  leaves behind) are reparented to it and reaped here; this machine's PID 1 reaps nothing;
- starts each service in order, in the foreground, as its own child (`munged -F`, `slurmctld -D`,
  `slurmd -D -N nodeNN`, `systemd-nspawn -b ...`), waiting for a ready path where one is given;
- restarts a guest whose nspawn exits with 133: systemd-nspawn's status for "the guest asked for
  a reboot", so `systemctl reboot` and ansible.builtin.reboot inside a guest are real reboots on
  the same writable overlay;
- writes its live view (pids, boots, last exit) to a JSON file after every change, for `status`;
- on SIGTERM/SIGINT halts the guests cleanly (nspawn turns SIGTERM into a guest power-off), then
  stops the daemons in reverse order, kills whatever is left below it, and exits 0.

Every child carries K3FLEET_TESTBED_WORKDIR in its environment: after a SIGKILL of this process
`down` still finds them, and their descendants, by that mark.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.lab.common import supervise

MODULE = "k3fleet.lab.testbed.supervisor"
LABEL = "supervisor"
# systemd-nspawn exits 133 when the container's init asked for a reboot.
NSPAWN_REBOOT_EXIT = 133
MARK_ENV = "K3FLEET_TESTBED_WORKDIR"
GUEST_HALT_GRACE = 25.0
DAEMON_STOP_GRACE = 10.0
READY_TIMEOUT = 30.0
# A guest that "reboots" more often than this within a minute is crash-looping: stop restarting it.
MAX_RESTARTS_PER_MINUTE = 10


@dataclass
class Service:
    name: str
    kind: str
    argv: list[str]
    env: dict[str, str]
    user: str | None = None
    ready_path: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    last_exit: int | None = None
    restart_times: list[float] = field(default_factory=list)
    gave_up: str | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid


class Supervisor(supervise.BaseSupervisor):
    label = LABEL
    live_indent = 2

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.workdir = Path(spec["workdir"])
        self.log_dir = Path(spec["log_dir"])
        self.services = [
            Service(
                name=s["name"],
                kind=s["kind"],
                argv=list(s["argv"]),
                env=dict(s.get("env") or {}),
                user=s.get("user"),
                ready_path=s.get("ready_path"),
            )
            for s in spec["services"]
        ]
        self.by_pid: dict[int, Service] = {}
        self.events: list[str] = []

    # -- bookkeeping -------------------------------------------------------------------------
    def live_view(self) -> dict[str, Any]:
        return {
            "services": {
                s.name: {
                    "kind": s.kind,
                    "pid": s.pid,
                    "running": s.proc is not None and s.proc.returncode is None,
                    "starts": s.starts,
                    "last_exit": s.last_exit,
                    "gave_up": s.gave_up,
                }
                for s in self.services
            },
        }

    # -- starting ----------------------------------------------------------------------------
    def start(self, service: Service) -> None:
        env = dict(os.environ)
        env.update(service.env)
        env[MARK_ENV] = str(self.workdir)
        env.setdefault("LC_ALL", "C")
        log_path = self.log_dir / f"{service.name}.log"
        kwargs: dict[str, Any] = {}
        if service.user is not None:
            kwargs = {"user": service.user, "group": service.user, "extra_groups": []}
        with open(log_path, "ab") as log:
            service.proc = subprocess.Popen(
                service.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd="/",
                close_fds=True,
                **kwargs,
            )
        service.starts += 1
        self.by_pid[service.proc.pid] = service
        self.log(f"started {service.name} pid {service.proc.pid} (start #{service.starts})")
        self.write_live()

    def wait_ready(self, service: Service) -> None:
        if service.ready_path is None:
            return
        deadline = time.monotonic() + READY_TIMEOUT
        while not Path(service.ready_path).exists():
            self.reap()
            if service.proc is None or service.proc.returncode is not None:
                self.log(f"{service.name} exited before {service.ready_path} appeared")
                return
            if time.monotonic() > deadline or self.stopping:
                self.log(f"{service.name}: {service.ready_path} did not appear within {READY_TIMEOUT:.0f}s")
                return
            time.sleep(0.05)

    # -- reaping and restarts ------------------------------------------------------------------
    def reap(self) -> None:
        """Collect every exited child: our services and any orphan reparented to us."""
        for pid, code in supervise.exited_children():
            service = self.by_pid.pop(pid, None)
            if service is None:
                continue
            if service.proc is not None:
                service.proc.returncode = code
            service.last_exit = code
            self.log(f"{service.name} pid {pid} exited with {code}")
            self.on_exit(service, code)
            self.write_live()

    def on_exit(self, service: Service, code: int) -> None:
        if self.stopping or service.kind != "guest" or code != NSPAWN_REBOOT_EXIT:
            return
        now = time.monotonic()
        service.restart_times = [t for t in service.restart_times if now - t < 60.0] + [now]
        if len(service.restart_times) > MAX_RESTARTS_PER_MINUTE:
            service.gave_up = f"rebooted {len(service.restart_times)} times within a minute"
            self.log(f"{service.name}: not restarting, {service.gave_up}")
            return
        # The guest asked for a reboot: same overlay, same namespace, fresh boot.
        self.start(service)

    # -- stopping ------------------------------------------------------------------------------
    def request_stop(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            self.log(f"received signal {signum}, stopping")
        self.stopping = True

    def _stop_group(self, services: list[Service], grace: float) -> None:
        live = [s for s in services if s.proc is not None and s.proc.returncode is None]
        for s in live:
            assert s.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(s.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.reap()
            if all(s.proc is None or s.proc.returncode is not None for s in live):
                return
            time.sleep(0.1)
        for s in live:
            if s.proc is not None and s.proc.returncode is None:
                self.log(f"{s.name} did not stop within {grace:.0f}s, SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(s.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            self.reap()
            if all(s.proc is None or s.proc.returncode is not None for s in live):
                return
            time.sleep(0.1)

    def stop_children(self) -> None:
        # Guests first (a clean halt), then the daemons; orphans adopted as subreaper (slurmstepd,
        # job processes) are killed after this.
        guests = [s for s in self.services if s.kind == "guest"]
        daemons = [s for s in self.services if s.kind != "guest"]
        self._stop_group(guests, GUEST_HALT_GRACE)
        # Reverse start order: slurmd before slurmctld before munged.
        for service in reversed(daemons):
            self._stop_group([service], DAEMON_STOP_GRACE)

    # -- main ----------------------------------------------------------------------------------
    def start_children(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for service in self.services:
            if self.stopping:
                break
            self.start(service)
            self.wait_ready(service)

    def tick(self) -> None:
        self.reap()


def main(argv: list[str] | None = None) -> int:
    return supervise.main(argv, module=MODULE, label=LABEL, run=lambda spec: Supervisor(spec).run())


if __name__ == "__main__":
    sys.exit(main())
