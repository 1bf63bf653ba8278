"""The supervisor side: what every lab supervisor does the same way, inside its own process.

This machine's PID 1 reaps nothing, so a supervisor makes itself a child subreaper: whatever
daemonizes or is orphaned below it is reparented to it and reaped here, not left <defunct>.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from k3fleet.lab.common import proc
from k3fleet.lab.common.workdir import write_atomic

PR_SET_CHILD_SUBREAPER = 36
TICK = 0.2
StopHandler = Callable[[int, Any], None]


def log_line(label: str, message: str) -> None:
    """One time-stamped line on stdout, which the harness sends to the supervisor log."""
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {label}[{os.getpid()}]: {message}", flush=True)


def become_subreaper(log: Callable[[str], None]) -> None:
    """Orphans below this process are reparented to it (and must be reaped here)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log(f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}")


def take_charge(log: Callable[[str], None], request_stop: StopHandler) -> None:
    """Become a child subreaper; SIGTERM/SIGINT ask for a stop, SIGHUP (a closed terminal) is ignored."""
    become_subreaper(log)
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def exited_children() -> Iterator[tuple[int, int]]:
    """(pid, exit code) of every child that has exited, ours or adopted, without blocking."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def live_children() -> list[int]:
    me = os.getpid()
    return [pid for pid in proc.all_pids() if (stat := proc.read_stat(pid)) is not None
            and stat[1] == me and stat[0] != "Z"]


def kill_adopted_children(reap: Callable[[], object]) -> None:
    """Stragglers and orphans adopted as subreaper: SIGKILL and reap until none is left."""
    for _ in range(50):
        reap()
        kids = live_children()
        if not kids:
            return
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def write_live(path: Path, data: dict[str, Any], *, indent: int | None = None) -> None:
    write_atomic(path, json.dumps(data, indent=indent), prefix=".live-")


class BaseSupervisor(ABC):
    """The life of a supervisor: take charge, start, run until a stop signal, shut down, exit 0.

    A subclass starts its children, reaps them on every tick and stops them; its live view
    (``spec["live_file"]``) carries ``pid``, ``phase`` (starting, running, stopping, stopped),
    ``updated`` and what ``live_view`` says of the children.
    """

    label: ClassVar[str]
    live_indent: ClassVar[int | None] = None

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.stopping = False
        self.phase = "starting"
        self.live_file = Path(spec["live_file"])

    def log(self, message: str) -> None:
        log_line(self.label, message)

    def request_stop(self, signum: int, _frame: object) -> None:
        self.stopping = True

    def write_live(self) -> None:
        data = {"pid": os.getpid(), "phase": self.phase, "updated": time.time(), **self.live_view()}
        write_live(self.live_file, data, indent=self.live_indent)

    @abstractmethod
    def live_view(self) -> dict[str, Any]:
        """The children as the harness reads them (pids, running, exits)."""

    @abstractmethod
    def start_children(self) -> None:
        """Start everything, waiting for readiness; return early once ``stopping`` is set."""

    @abstractmethod
    def reap(self) -> object:
        """Collect every exited child, ours or adopted, without blocking."""

    @abstractmethod
    def tick(self) -> None:
        """Reap what exited and react to it."""

    @abstractmethod
    def stop_children(self) -> None:
        """Stop our children (SIGTERM, a grace, SIGKILL)."""

    def shutdown(self) -> None:
        self.phase = "stopping"
        self.write_live()
        self.stop_children()
        # Stragglers and orphans adopted as subreaper: SIGKILL and reap until none is left.
        kill_adopted_children(self.reap)
        self.reap()
        self.phase = "stopped"
        self.write_live()
        self.log("stopped")

    def run(self) -> int:
        take_charge(self.log, self.request_stop)
        self.start_children()
        if not self.stopping:
            self.phase = "running"
            self.write_live()
        while not self.stopping:
            self.tick()
            time.sleep(TICK)
        self.shutdown()
        return 0


def main(argv: list[str] | None, *, module: str, label: str, run: Callable[[dict[str, Any]], int]) -> int:
    """``python -m MODULE SPEC.json``: read the spec and hand it to ``run``; exit 2 on a bad call or spec."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {module} SPEC.json", file=sys.stderr)
        return 2
    try:
        spec = json.loads(Path(args[0]).read_text())
    except (OSError, ValueError) as exc:
        print(f"{label}: cannot read spec {args[0]}: {exc}", file=sys.stderr)
        return 2
    return run(spec)
