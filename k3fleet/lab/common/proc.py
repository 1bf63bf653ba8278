"""Process, command and /proc helpers of the lab harnesses and their supervisors.

This machine's PID 1 does not reap orphans, so "is it gone" treats a zombie as gone, and every
kill also tries to reap the pid when it happens to be our child.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from k3fleet.lab.common.errors import LabError

# Where the harnesses look for the machine's tools: PATH, then the sbin directories a non-login
# root shell may leave out.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])

STDERR_TAIL = 400


def require_root(label: str, needs: str, error: type[LabError]) -> None:
    """Fail with one line unless we run as root; ``needs`` says what for."""
    if os.geteuid() != 0:
        raise error(f"{label}: root required ({needs}); euid is {os.geteuid()}")


def which(name: str) -> str | None:
    """The absolute path of a tool on SEARCH_PATH, or None."""
    return shutil.which(name, path=SEARCH_PATH)


def find_tools(names: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """(name -> absolute path of every tool found, the names not found)."""
    found: dict[str, str] = {}
    missing: list[str] = []
    for name in names:
        path = which(name)
        if path is None:
            missing.append(name)
        else:
            found[name] = path
    return found, missing


def _tail(text: str | bytes | None) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text[-STDERR_TAIL:]


def run(
    argv: Sequence[str],
    *,
    what: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    input_text: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run one command with C locale; on failure raise one line naming `what` and the stderr tail."""
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("LC_ALL", "C")
    try:
        proc = subprocess.run(
            list(argv),
            env=full_env,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{what}: `{' '.join(argv)}` timed out after {timeout:.0f}s: {_tail(exc.stderr)}") from exc
    except OSError as exc:
        raise LabError(f"{what}: cannot run `{argv[0]}`: {exc}") from exc
    if check and proc.returncode != 0:
        detail = _tail(proc.stderr) or _tail(proc.stdout) or "(no output)"
        raise LabError(f"{what}: `{' '.join(argv)}` exited {proc.returncode}: {detail}")
    return proc


def read_stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, ppid, start time in clock ticks) of a pid, or None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parentheses: the fields we need follow the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    if len(rest) < 20:
        return None
    return rest[0], int(rest[1]), int(rest[19])


def pid_alive(pid: int) -> bool:
    """True while the pid runs; a zombie (exited, not reaped by a parent) counts as gone."""
    stat = read_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def start_time(pid: int) -> int | None:
    stat = read_stat(pid)
    return None if stat is None else stat[2]


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def children(pid: int) -> list[int]:
    """Direct children of pid (scan of /proc, works for pids that are not ours)."""
    found = []
    for candidate in all_pids():
        stat = read_stat(candidate)
        if stat is not None and stat[1] == pid:
            found.append(candidate)
    return found


def own_lineage() -> set[int]:
    """Our pid and our ancestors: never kill those, whatever their command line says."""
    lineage = set()
    pid = os.getpid()
    while pid > 1:
        lineage.add(pid)
        stat = read_stat(pid)
        if stat is None:
            break
        pid = stat[1]
    return lineage


def find_pids(match: Callable[[list[str]], bool]) -> list[int]:
    """Live pids whose argv satisfies `match`, excluding this process and its ancestors."""
    skip = own_lineage()
    found = []
    for pid in all_pids():
        if pid in skip:
            continue
        argv = cmdline(pid)
        if argv and match(argv) and pid_alive(pid):
            found.append(pid)
    return found


def reap(pid: int) -> None:
    """Collect the exit status when pid is our child, so it does not stay <defunct>."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def reap_zombie_children() -> int:
    """Reap children of this process that already exited; returns how many.

    For a caller that made itself a child subreaper: orphans of a killed supervisor become its
    children, and only it can collect them. Only zombies are touched, so no running child's
    exit status is taken from its owner.
    """
    me = os.getpid()
    reaped = 0
    for pid in all_pids():
        stat = read_stat(pid)
        if stat is not None and stat[1] == me and stat[0] == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            reaped += 1
    return reaped


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until all pids are gone (or zombies); return the ones still alive at the deadline."""
    remaining = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        for pid in remaining:
            reap(pid)
        remaining = [pid for pid in remaining if pid_alive(pid)]
        if not remaining or time.monotonic() >= deadline:
            return remaining
        time.sleep(0.1)


def terminate(pids: Iterable[int], *, grace: float, what: str) -> None:
    """SIGTERM, wait `grace` seconds, then SIGKILL; raise if something survives even that."""
    targets = [pid for pid in pids if pid_alive(pid)]
    if not targets:
        return
    signal_pids(targets, signal.SIGTERM)
    left = wait_gone(targets, grace)
    if left:
        signal_pids(left, signal.SIGKILL)
        left = wait_gone(left, 5.0)
    if left:
        raise LabError(f"{what}: pids {left} survived SIGKILL (stuck in the kernel?)")


def wait_for(
    check: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll `check` until true; on timeout raise one line naming what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if time.monotonic() >= deadline:
            extra = f": {detail()}" if detail is not None else ""
            raise LabError(f"{what}: not ready after {timeout:.0f}s{extra}")
        time.sleep(interval)
