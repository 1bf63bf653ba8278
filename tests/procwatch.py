"""Every process a command started, watched while it runs, to show afterwards that none is left.

A thread samples ``/proc`` every 0.1 s for the descendants of one process (with their start times, so
a reused pid is never taken for a survivor). ansible-playbook's workers are sessions of their own, so
a test that looked only at the command's session or process group would miss them; a descendant seen
once is remembered even after its parent is gone.
"""

from __future__ import annotations

import threading
from pathlib import Path


def stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def processes() -> dict[int, list[str]]:
    out = {}
    for entry in Path("/proc").glob("[0-9]*"):
        st = stat(int(entry.name))
        if st is not None:
            out[int(entry.name)] = st
    return out


def cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def descendants(root: int, procs: dict[int, list[str]]) -> set[int]:
    found = {root}
    grew = True
    while grew:
        more = {pid for pid, st in procs.items() if int(st[1]) in found and pid not in found}
        found |= more
        grew = bool(more)
    return found - {root}


def alive(pid: int, start: str) -> bool:
    """The same process (start time), not a reused pid, and not a zombie waiting for its reaper."""
    st = stat(pid)
    return st is not None and st[19] == start and st[0] not in ("Z", "X")


class Watcher(threading.Thread):
    """Remembers every descendant of ``root`` seen while it runs; ``left()`` names the ones still alive."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.seen: dict[int, str] = {}
        self.playbooks = 0
        self.halt = threading.Event()

    def sample(self) -> None:
        procs = processes()
        mine = descendants(self.root, procs)
        for pid in mine:
            self.seen.setdefault(pid, procs[pid][19])
        self.playbooks = sum(1 for p in mine if any("ansible-playbook" in a for a in cmdline(p)[:3]))

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(0.1)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)

    def left(self) -> list[tuple[int, list[str]]]:
        return [(pid, cmdline(pid)) for pid, start in sorted(self.seen.items()) if alive(pid, start)]

    def in_session(self) -> list[tuple[int, list[str]]]:
        """Live processes whose session or process group is the root's (started with a new session)."""
        return [(pid, cmdline(pid)) for pid, st in processes().items()
                if st[0] not in ("Z", "X") and self.root in (int(st[3]), int(st[4]))]
