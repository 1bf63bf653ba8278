"""Drive ansible-playbook through ansible-runner and turn its events into per-host outcomes.

Nothing here parses Ansible's stdout: results come from structured events, matched by
host and by the one stable key (``k3fleet``) that every k3fleet module returns.
Display stays out of this module: callers pass an observer.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.errors import UsageError
from k3fleet.paths import data_dir

RESULT_KEY = "k3fleet"

# Event names that close a host's task (see ansible-runner's event schema).
_OK = "runner_on_ok"
_FAILED = "runner_on_failed"
_UNREACHABLE = "runner_on_unreachable"
_SKIPPED = "runner_on_skipped"
_STATS = "playbook_on_stats"


@dataclass
class HostOutcome:
    """What one host's run of a task came to."""

    host: str
    status: str  # ok, failed, unreachable, skipped, timeout
    task: str | None = None
    result: dict[str, Any] | None = None
    message: str | None = None
    duration_s: float | None = None


@dataclass
class PlayResult:
    playbook: str
    status: str  # successful, failed, timeout, canceled, error
    rc: int | None
    hosts: dict[str, list[HostOutcome]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    interrupted: bool = False
    stderr_tail: str = ""

    def last(self, host: str) -> HostOutcome | None:
        outs = self.hosts.get(host)
        return outs[-1] if outs else None

    def results_with_key(self, key: str = RESULT_KEY) -> dict[str, dict[str, Any]]:
        """Per host, the last module result carrying ``key``."""
        found: dict[str, dict[str, Any]] = {}
        for host, outs in self.hosts.items():
            for out in outs:
                if out.status == "ok" and out.result and key in out.result:
                    found[host] = out.result[key]
        return found


class Observer:
    """Progress sink; the CLI renders it, tests record it."""

    def play_started(self, playbook: str, hosts: int | None) -> None:
        """Called once before the play runs."""

    def host_done(self, outcome: HostOutcome) -> None:
        """Called each time a host finishes a task."""

    def play_finished(self, result: PlayResult) -> None:
        """Called once after the play ran."""


def ansible_env(extra_roles: Sequence[Path] = ()) -> dict[str, str]:
    """Where Ansible finds k3fleet's modules, module_utils and roles, from a checkout or a wheel."""
    pkg = Path(__file__).resolve().parent
    roles = [str(p) for p in extra_roles]
    with contextlib.suppress(FileNotFoundError):  # no roles shipped: playbooks without roles still run
        roles.insert(0, str(data_dir("roles")))
    return {
        "ANSIBLE_LIBRARY": str(pkg / "ansible" / "modules"),
        "ANSIBLE_MODULE_UTILS": str(pkg / "ansible" / "module_utils"),
        "ANSIBLE_DOC_FRAGMENT_PLUGINS": str(pkg / "ansible" / "doc_fragments"),
        "ANSIBLE_ROLES_PATH": os.pathsep.join(roles),
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_GATHERING": "explicit",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_INTERPRETER_PYTHON": "auto_silent",
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=60s",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        # ansible-core refuses a world-writable cwd's ansible.cfg; ours is passed explicitly instead.
        "ANSIBLE_CONFIG": str(data_dir("ansible.cfg")),
    }


def playbook_path(name: str) -> Path:
    try:
        path = data_dir("playbooks") / name
    except FileNotFoundError as exc:
        raise UsageError(f"playbook {name}: {exc}") from exc
    if not path.is_file():
        raise UsageError(f"playbook {name} not found under {path.parent}: the installation is incomplete")
    return path


def _ansible_playbook_on_path() -> str:
    """ansible-runner spawns ansible-playbook from PATH: make the running interpreter's bin/ win."""
    bindir = Path(sys.executable).parent
    path = os.environ.get("PATH", "")
    if (bindir / "ansible-playbook").exists() and str(bindir) not in path.split(os.pathsep):
        path = os.pathsep.join([str(bindir), path])
    if not shutil.which("ansible-playbook", path=path):
        raise UsageError("ansible-playbook not found on PATH: install ansible-core in this environment")
    return path


# The task keyword `timeout` ends a task with this message (ansible-core 2.10+).
_TASK_TIMEOUT = re.compile(r"(?i)timed out after \d+ second")


def _outcome(event: Mapping[str, Any]) -> HostOutcome | None:
    name = event.get("event")
    data = event.get("event_data") or {}
    host = data.get("host")
    if not host or name not in (_OK, _FAILED, _UNREACHABLE, _SKIPPED):
        return None
    res = data.get("res") or {}
    status = {_OK: "ok", _FAILED: "failed", _UNREACHABLE: "unreachable", _SKIPPED: "skipped"}[name]
    msg = res.get("msg") if isinstance(res, dict) else None
    if status == "failed" and isinstance(msg, str) and _TASK_TIMEOUT.search(msg):
        status = "timeout"
    if status == "failed" and data.get("ignore_errors"):
        status = "ignored"
    return HostOutcome(
        host=str(host),
        status=status,
        task=data.get("task"),
        result=res if isinstance(res, dict) else None,
        message=_one_line(msg) if msg else None,
        duration_s=data.get("duration"),
    )


def _one_line(text: Any) -> str:
    text = " ".join(str(text).split())
    # ansible-core 2.19 prefixes every task error with this; it says nothing the status does not.
    text = text.removeprefix("Task failed: ")
    return text[:400]


def run_playbook(
    playbook: str,
    inventory: Path,
    private_dir: Path,
    *,
    extravars: Mapping[str, Any] | None = None,
    limit: str | None = None,
    forks: int = 20,
    check: bool = False,
    observer: Observer | None = None,
    keep_events: bool = True,
    timeout: int | None = None,
    cancel: threading.Event | None = None,
    hosts: int | None = None,
) -> PlayResult:
    """Run one playbook and collect per-host outcomes from its events (``hosts``: how many, for progress)."""
    import ansible_runner  # heavy import kept off the CLI's start-up path

    observer = observer or Observer()
    pb = playbook_path(playbook)
    if not inventory.exists():
        raise UsageError(f"inventory {inventory} does not exist")
    private_dir.mkdir(parents=True, exist_ok=True)
    env = ansible_env()
    env["PATH"] = _ansible_playbook_on_path()
    result = PlayResult(playbook=playbook, status="error", rc=None)
    cancel = cancel or threading.Event()

    def on_event(event: dict[str, Any]) -> bool:
        if keep_events:
            result.events.append(_slim(event))
        outcome = _outcome(event)
        if outcome is not None:
            result.hosts.setdefault(outcome.host, []).append(outcome)
            observer.host_done(outcome)
        elif event.get("event") == _STATS:
            result.stats = {k: v for k, v in (event.get("event_data") or {}).items()
                            if k in ("ok", "failures", "dark", "changed", "skipped", "ignored", "rescued")}
        # False: ansible-runner need not write every event to disk; the run directory keeps ours.
        return False

    cmdline = "--check" if check else None
    observer.play_started(playbook, hosts)
    started, cpu0 = time.monotonic(), _children_cpu()
    try:
        r = ansible_runner.run(
            private_data_dir=str(private_dir),
            playbook=str(pb),
            inventory=str(inventory.resolve()),
            extravars=dict(extravars or {}),
            limit=limit,
            forks=forks,
            cmdline=cmdline,
            envvars=env,
            quiet=True,
            event_handler=on_event,
            cancel_callback=cancel.is_set,
            timeout=timeout,
            rotate_artifacts=1,
            suppress_env_files=True,
        )
    except KeyboardInterrupt:
        result.interrupted = True
        result.status = "canceled"
        result.wall_s = time.monotonic() - started
        observer.play_finished(result)
        return result
    result.wall_s = time.monotonic() - started
    result.cpu_s = _children_cpu() - cpu0
    result.status = r.status
    result.rc = r.rc
    if r.status == "canceled":
        result.interrupted = True
    try:
        result.stderr_tail = _tail(r.stdout.read() if r.stdout else "")
    except (OSError, ValueError):
        result.stderr_tail = ""
    observer.play_finished(result)
    return result


def _children_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])


_EVENT_KEEP = ("event", "uuid", "counter", "created", "parent_uuid")
_DATA_KEEP = ("host", "task", "task_uuid", "play", "duration", "ignore_errors", "start", "end")


def _slim(event: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an event worth keeping as evidence (module results are stored separately)."""
    out = {k: event[k] for k in _EVENT_KEEP if k in event}
    data = event.get("event_data") or {}
    slim = {k: data[k] for k in _DATA_KEEP if k in data}
    res = data.get("res")
    if isinstance(res, dict):
        slim["res"] = {k: v for k, v in res.items() if k != RESULT_KEY and k != "invocation"}
        if RESULT_KEY in res:
            slim["res"]["has_result"] = True
    out["event_data"] = slim
    return out
