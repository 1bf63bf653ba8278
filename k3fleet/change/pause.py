"""An operator in the loop: ``upgrade --pause-after canary|each-host|wave`` (docs/change-night.md "Pauses").

The pause is kept by the slot gate itself (``k3fleet_journal_format.pause_decision``, under the journal's
lock): a host whose turn comes after a pause point waits for its slot until a continue token for that
point exists in the run's continue directory (``<runs>/.k3fleet/continue/<run>/``). So no host is drained
past a pause point, whoever is watching; the wait is bounded (``--pause-timeout``), after which the host
stops before its drain and the night ends as interrupted, ready for ``--resume``.

This module is the controller's half: it sees the journal lines as the play reports them, says when a
pause point is reached (``pending-<token>`` in the directory and a line on stderr), asks on a terminal
(Enter continues), and writes the token for ``k3fleet upgrade --continue RUN`` or on Enter. ``touch`` of
the token's path continues too.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_journal_format import PAUSE_AFTER
from k3fleet.bounds import loads_json
from k3fleet.change.lock import state_dir
from k3fleet.errors import UsageError

CONTINUE_DIR = "continue"
PENDING = "pending-"


def continue_dir(runs_dir: Path, run: str) -> Path:
    return state_dir(runs_dir) / CONTINUE_DIR / run


def check_pause(after: str | None) -> None:
    if after is not None and after not in PAUSE_AFTER:
        raise UsageError(f"--pause-after {after!r}: choose one of {', '.join(PAUSE_AFTER)}")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _write(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(dict(data)) + "\n")
    os.replace(tmp, path)


def continue_run(runs_dir: Path, run: Path, operator: str) -> list[str]:
    """Continue every pause point the run is waiting at (``k3fleet upgrade --continue RUN``); returns them."""
    where = continue_dir(runs_dir, Path(run).name)
    pending = sorted(p.name[len(PENDING):] for p in where.glob(f"{PENDING}*")) if where.is_dir() else []
    waiting = [t for t in pending if not (where / t).exists()]
    if not waiting:
        raise UsageError(f"run {Path(run).name} is not paused (nothing waits in {where}): is it running with "
                         "--pause-after, under this --runs-dir?")
    for token in waiting:
        _write(where / token, {"by": operator, "at": _now(), "how": "k3fleet upgrade --continue"})
    return waiting


class PauseWatcher:
    """Says when a pause point is reached and, on a terminal, continues on Enter."""

    def __init__(self, after: str, batches: Sequence[Sequence[str]], directory: Path, timeout: int, *,
                 say: Callable[[str], None], run: Path, interactive: bool | None = None) -> None:
        self.after = after
        self.batches = [list(b) for b in batches]
        self.dir = directory
        self.timeout = timeout
        self.say = say
        self.run = run
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self.returned: list[str] = []
        self.reached: list[str] = []
        self._lock = threading.Lock()
        self.dir.mkdir(parents=True, exist_ok=True)

    def gate(self) -> dict[str, Any]:
        """What the slot gate needs (``k3fleet_gate.pause``)."""
        return {"after": self.after, "batches": self.batches, "dir": str(self.dir.resolve())}

    def on_line(self, line: Mapping[str, Any]) -> None:
        if line.get("stage") != "returned" or line.get("interrupted"):
            return
        host = str(line.get("host"))
        with self._lock:
            if host in self.returned:
                return
            self.returned.append(host)
            points = self._points(host)
            for token, what in points:
                self._reach(token, what)

    def _points(self, host: str) -> list[tuple[str, str]]:
        hosts = [h for b in self.batches for h in b]
        if self.after == "each-host":
            if len(self.returned) >= len(hosts):
                return []
            return [(f"after-host-{host}", f"after {host} returned to service")]
        last = 0 if self.after == "canary" else len(self.batches) - 2
        out = []
        for i, batch in enumerate(self.batches[:last + 1]):
            if all(h in self.returned for h in batch) and f"after-batch-{i}" not in self.reached:
                name = f"the canary {batch[0]}" if i == 0 else f"wave {i} ({len(batch)} host(s))"
                out.append((f"after-batch-{i}", f"after {name} returned to service"))
        return out

    def _reach(self, token: str, what: str) -> None:
        self.reached.append(token)
        _write(self.dir / f"{PENDING}{token}", {"point": token, "what": what, "since": _now()})
        how = (f"k3fleet upgrade --continue {self.run} --change-id ID --operator NAME, or touch "
               f"{self.dir / token}; the next drain waits at most {self.timeout}s")
        self.say(f"paused {what}: " + ("press Enter to continue, or " if self.interactive else "continue with ")
                 + how)
        if self.interactive:
            threading.Thread(target=self._ask, args=(token,), daemon=True).start()

    def _ask(self, token: str) -> None:
        try:
            got = sys.stdin.readline()
        except (OSError, ValueError):
            return
        if got and not (self.dir / token).exists():
            _write(self.dir / token, {"by": os.environ.get("USER") or "operator", "at": _now(), "how": "Enter"})
            self.say(f"continued ({token})")

    def record(self) -> list[dict[str, Any]]:
        """Each pause point reached and how it was continued (for run.json)."""
        out = []
        for token in self.reached:
            row: dict[str, Any] = {"point": token}
            for name, key in ((f"{PENDING}{token}", "reached"), (token, "continued")):
                try:
                    row[key] = loads_json((self.dir / name).read_text())
                except (OSError, ValueError):
                    row[key] = None
            out.append(row)
        return out

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
