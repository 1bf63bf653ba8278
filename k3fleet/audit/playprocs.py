"""Every process of one play, found and stopped when the play ends (docs/safety.md "A play's processes").

ansible-runner runs ansible-playbook under a pty in a session of its own and, when a play is
cancelled or times out, kills that session's process group. That is not the whole play:
ansible-core's workers call ``setsid()`` (each is a session of one), so they outlive their parent,
as ssh ControlPersist masters do by design. A SIGTERM or SIGHUP to a k3fleet command used to leave
a dozen ``ansible-playbook`` workers hung for good.

So every play's environment carries a token of its own (:data:`PLAY_ENV`), which every process it
starts inherits; when the play ends, however it ends, :func:`stop_play` finds the processes whose
environment holds the token, and their descendants, and stops them: SIGTERM, then SIGKILL after a
grace. A process that dropped its environment (``sudo``'s children) is still found through its
parent. Linux ``/proc`` only; elsewhere nothing is found and nothing is stopped.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Iterable
from pathlib import Path

PLAY_ENV = "K3FLEET_PLAY"
_PROC = Path("/proc")


def new_token() -> str:
    return secrets.token_hex(8)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, None when it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _carries(pid: int, mark: bytes) -> bool:
    try:
        env = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return mark in env.split(b"\0")


def play_processes(token: str) -> list[int]:
    """Live processes of the play: those whose environment carries its token, and their descendants."""
    mark = f"{PLAY_ENV}={token}".encode()
    me = os.getpid()
    parents: dict[int, int] = {}
    for entry in _PROC.glob("[0-9]*"):
        pid = int(entry.name)
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X") or pid == me:
            continue
        parents[pid] = st[1]
    found = {pid for pid in parents if _carries(pid, mark)}
    grew = True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in found and pid not in found}
        found |= more
        grew = bool(more)
    return sorted(found)


def _alive(pids: Iterable[int]) -> list[int]:
    out = []
    for pid in pids:
        st = _stat(pid)
        if st is not None and st[0] not in ("Z", "X"):
            out.append(pid)
    return out


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def stop_play(token: str, grace: float = 3.0) -> list[int]:
    """Stop every process of the play: SIGTERM (and SIGCONT, for a stopped one), then SIGKILL what
    is left after ``grace`` seconds. Returns the pids it found. Idempotent."""
    pids = play_processes(token)
    if not pids:
        return []
    _signal(pids, signal.SIGTERM)
    _signal(pids, signal.SIGCONT)
    deadline = time.monotonic() + grace
    left = _alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _alive(left)
    # A process started in the meantime by one being stopped (a worker's last ssh) goes too.
    left = sorted(set(left) | set(play_processes(token)))
    _signal(left, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _alive(left)
    return sorted(set(pids) | set(left))
