"""The harness side of a supervised lab: start the supervisor, read it, find and stop what is ours.

Finding works without the state file (it may be gone or stale after a crash): by the
supervisor's module and spec path on its command line, by a mark in the environment of every
process it started, and by TCP connections to the lab's addresses.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

import k3fleet
from k3fleet.lab.common import proc
from k3fleet.lab.common.workdir import WorkdirLayout, read_json_object

KILL_WAIT = 5.0


class Supervised(Protocol):
    """The part of a saved state that names its supervisor."""

    supervisor_pid: int | None
    supervisor_start_time: int | None


# argv of `python -c`: ["-c", MODULE, SPEC].
_SUPERVISOR_ENTRY = ("import sys; from importlib import import_module; "
                     "sys.exit(import_module(sys.argv[1]).main(sys.argv[2:]))")


def spawn_supervisor(module: str, layout: WorkdirLayout, spec_text: str,
                     env_extra: Mapping[str, str]) -> tuple[int, int | None]:
    """Write the spec and start the supervisor ``MODULE`` on it, detached; (pid, start time) to guard reuse.

    Started through ``-c`` rather than ``-m``: the lab packages import their supervisor module, and
    runpy warns when ``-m`` finds the module it is about to run already imported. MODULE and SPEC
    stay whole arguments of the command line, which is how ``supervisor_pids`` recognises it."""
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    layout.supervisor_spec.write_text(spec_text)
    env = dict(os.environ)
    # The supervisor imports this package: make sure it finds the same copy we run from.
    package_root = str(Path(k3fleet.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.update(env_extra)
    with open(layout.supervisor_log, "ab") as log:
        child = subprocess.Popen([sys.executable, "-c", _SUPERVISOR_ENTRY, module, str(layout.supervisor_spec)],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/",
                                 start_new_session=True, close_fds=True)
    return child.pid, proc.start_time(child.pid)


def read_live(layout: WorkdirLayout) -> dict[str, Any]:
    """The supervisor's live view; empty when it is missing or half-written."""
    return read_json_object(layout.supervisor_live) or {}


def log_tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


def supervisor_alive(state: Supervised) -> bool:
    pid = state.supervisor_pid
    if pid is None or not proc.pid_alive(pid):
        return False
    # Guard against pid reuse after a crash: same start time as when we launched it.
    return state.supervisor_start_time is None or proc.start_time(pid) == state.supervisor_start_time


def supervisor_pids(module: str, layout: WorkdirLayout, state: Supervised | None) -> list[int]:
    """The saved supervisor when it still runs, and any other running on this work directory's spec."""
    pids = []
    if state is not None and state.supervisor_pid is not None and supervisor_alive(state):
        pids.append(state.supervisor_pid)
    spec = str(layout.supervisor_spec)
    pids += proc.find_pids(lambda argv: module in argv and spec in argv)
    return sorted(set(pids))


def stop(pids: Collection[int], grace: float) -> None:
    """SIGTERM, ``grace`` seconds to go, then SIGKILL."""
    if not pids:
        return
    proc.signal_pids(pids, signal.SIGTERM)
    left = proc.wait_gone(pids, grace)
    if left:
        proc.signal_pids(left, signal.SIGKILL)
        proc.wait_gone(left, KILL_WAIT)


def kill_until_gone(find: Callable[[], Collection[int]], rounds: int = 10) -> None:
    """SIGKILL what ``find`` returns until it returns nothing (a killed parent may leave children)."""
    for _ in range(rounds):
        pids = list(find())
        if not pids:
            return
        proc.signal_pids(pids, signal.SIGKILL)
        proc.wait_gone(pids, KILL_WAIT)


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def marked_processes(match: Callable[[int, list[str]], bool],
                     seed: Mapping[int, str] | None = None) -> dict[int, str]:
    """Live processes ``match(pid, argv)`` accepts, plus ``seed``, and all their descendants.

    Never this process or its ancestors, nor kernel threads (no argv).
    """
    skip = proc.own_lineage()
    parent_of: dict[int, int] = {}
    found: dict[int, str] = dict(seed or {})
    for pid in proc.all_pids():
        stat = proc.read_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        parent_of[pid] = stat[1]
        if pid in skip:
            continue
        argv = proc.cmdline(pid)
        if argv and match(pid, argv):
            found[pid] = " ".join(argv)[:120]
    changed = True
    while changed:
        changed = False
        for pid, ppid in parent_of.items():
            if ppid in found and pid not in found and pid not in skip:
                found[pid] = " ".join(proc.cmdline(pid))[:120]
                changed = True
    return found


def tcp_clients(is_lab_address: Callable[[str], bool], width: int = 120) -> dict[int, str]:
    """Processes on this machine holding a TCP connection to a lab address, with their command line.

    Ansible's ControlPersist masters rename themselves (`ssh: ~/.ansible/cp/... [mux]`) and
    outlive the play; left running after `down` they are handed the next run's connections to
    the same address.
    """
    inodes: set[str] = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            remote = ".".join(str(b) for b in reversed(bytes.fromhex(fields[2].split(":")[0])))
        except ValueError:
            continue
        if is_lab_address(remote):
            inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return {}
    skip = proc.own_lineage()
    found: dict[int, str] = {}
    for pid in proc.all_pids():
        if pid in skip:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    found[pid] = " ".join(proc.cmdline(pid))[:width]
                    break
    return found
