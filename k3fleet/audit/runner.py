"""Drive ansible-playbook through ansible-runner and turn its events into per-host outcomes.

Nothing here parses Ansible's stdout: results come from structured events, matched by
host and by the one stable key (``k3fleet``) that every k3fleet module returns.
Display stays out of this module: callers pass an observer.

Safety (docs/safety.md): ansible-runner's private data directory is a private temporary
directory (mode 0700, removed after the play), never the run directory; the play gets a minimal
environment; only evidence (the redacted Ansible output and a summary of the run) is copied into
the run directory, through the redactor. Host keys are checked unless the caller or the
inventory turns checking off, and that choice is recorded in command.json.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import RESULT_JSON_KEY, RESULT_KEY
from k3fleet.audit.inventory import load_inventory
from k3fleet.audit.playprocs import PLAY_ENV, new_token, stop_play
from k3fleet.bounds import loads_json
from k3fleet.errors import UsageError
from k3fleet.evidence import COMMAND, RunDir, layout
from k3fleet.evidence.reader import RunReader
from k3fleet.evidence.redact import redact_text
from k3fleet.paths import collections_path, data_dir


def module_result(res: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``res`` with facts sent as JSON text (RESULT_JSON_KEY) parsed back into RESULT_KEY, and why
    that failed (None when it did not, or there was no text). Any other result is ``res`` itself.

    k3fleet_host_info with facts_format=json (the audit play) sends its facts as one text: Ansible's
    main process then passes one string per host instead of copying and walking the facts node by
    node (docs/scale.md, "The controller's share")."""
    if RESULT_JSON_KEY not in res:
        return res, None
    out = dict(res)
    text = out.pop(RESULT_JSON_KEY)
    if text is None:
        return out, None
    if not isinstance(text, str):
        return out, f"{RESULT_JSON_KEY} is a {type(text).__name__}, not a JSON text"
    try:
        facts = loads_json(text)
    except ValueError as exc:
        return out, f"{RESULT_JSON_KEY} is not JSON: {exc}"
    if not isinstance(facts, dict):
        return out, f"{RESULT_JSON_KEY} is a JSON {type(facts).__name__}, not an object"
    out[RESULT_KEY] = facts
    return out, None

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
    # Processes of the play still running when it ended, stopped then (workers, ssh masters).
    stopped_processes: int = 0

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


# ssh arguments for every host; ssh takes the first value of an option, and these come first.
# A play that connects to each host once (the audit) opens no master: a ControlPersist master is
# one more ssh process per host that nothing reuses (docs/scale.md, "The controller's share").
_SSH_PERSIST = "-o ControlMaster=auto -o ControlPersist=60s"
_SSH_ONCE = "-o ControlMaster=no"
_SSH_CHECKED_OPTS = "-o StrictHostKeyChecking=yes"
# Unchecked connections do not write unverified keys into known_hosts, and keep their master
# connections apart so that a later checked run never reuses one.
_SSH_UNCHECKED_OPTS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
_UNCHECKED_CONTROL_DIR = "~/.ansible/cp-unchecked"

# The audit's strategy: Ansible's linear one that loads each host's connection plugin once, before
# the forks, and sleeps while every fork is busy (the collection's plugins/strategy/linear.py).
FLEET_STRATEGY = "k3fleet.gpu.linear"


def _ssh_args(checked: bool, persist: bool) -> str:
    return f"{_SSH_PERSIST if persist else _SSH_ONCE} {_SSH_CHECKED_OPTS if checked else _SSH_UNCHECKED_OPTS}"


def ansible_env(extra_roles: Sequence[Path] = (), *, host_key_checking: bool = True,
                persist: bool = True) -> dict[str, str]:
    """Where Ansible finds the k3fleet.gpu collection (from a checkout or a wheel) and any extra
    roles, and how it connects: host keys checked unless ``host_key_checking`` is False; ssh
    master connections kept for reuse unless ``persist`` is False (a play that connects once)."""
    # Ours first: a k3fleet.gpu installed elsewhere (an older release in ~/.ansible/collections)
    # must not be the one that runs; the operator's own paths stay for other collections.
    collections = [str(collections_path())]
    collections += [p for p in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(os.pathsep) if p]
    env = {
        "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(dict.fromkeys(collections)),
        "ANSIBLE_ROLES_PATH": os.pathsep.join(str(p) for p in extra_roles),
        # Set either way: a value inherited from the operator's shell must not decide silently.
        "ANSIBLE_HOST_KEY_CHECKING": str(bool(host_key_checking)),
        "ANSIBLE_GATHERING": "explicit",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_INTERPRETER_PYTHON": "auto_silent",
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_SSH_ARGS": _ssh_args(host_key_checking, persist),
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        # ansible-core refuses a world-writable cwd's ansible.cfg; ours is passed explicitly instead.
        "ANSIBLE_CONFIG": str(data_dir("ansible.cfg")),
    }
    if not host_key_checking:
        env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = _UNCHECKED_CONTROL_DIR
    return env


# What the play inherits from the controller's environment (docs/safety.md "Play environment"):
# what ssh and Ansible need, nothing else. Tokens and passwords of other tools stay out, also
# out of ansible-runner's own record of the environment.
_ENV_KEEP = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
                       "SSH_AUTH_SOCK", "SSH_AGENT_PID", "KRB5CCNAME", "KRB5_CONFIG", "VIRTUAL_ENV"})
_ENV_KEEP_PREFIXES = ("ANSIBLE_", "LC_")
# Names of further variables the operator passes on to the play (comma-separated), e.g. one an
# inventory reads with lookup('env', ...).
PASS_ENV = "K3FLEET_PASS_ENV"


def passed_env_names() -> set[str]:
    return {n.strip() for n in os.environ.get(PASS_ENV, "").split(",") if n.strip()}


def play_environment(prepared: Mapping[str, str], ours: Mapping[str, str]) -> dict[str, str]:
    """The play's environment: ansible-runner's prepared one without what the controller's shell
    carried beyond the allowed names (runner's own additions and ``ours`` stay)."""
    passed = passed_env_names()
    env = {}
    for name, value in prepared.items():
        inherited = os.environ.get(name) == value
        if (not inherited or name in ours or name in _ENV_KEEP or name.startswith(_ENV_KEEP_PREFIXES)
                or name in passed):
            env[name] = value
    return env


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


# What OpenSSH prints when it refuses a host key (docs/safety.md "Host keys"; real outputs in
# tests/fixtures/ssh/SOURCES.md).
_KEY_CHANGED = re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|host key for (?P<addr>\S+) has changed", re.I)
_KEY_UNKNOWN = re.compile(r"No \S+ host key is known for (?P<addr>\S+) and you have requested strict checking", re.I)
_KEY_FAILED = re.compile(r"Host key verification failed", re.I)
_OFFENDING = re.compile(r"Offending \S+ key in (?P<file>\S+?):(?P<line>\d+)")
_CHANGED_ADDR = re.compile(r"host key for (?P<addr>\S+) has changed", re.I)
_OPT_OUT = "or, as a recorded choice, --no-host-key-checking or the host's k3fleet_host_key_checking set to false"


def host_key_message(host: str, text: str) -> str | None:
    """One line naming the host and the fix when ``text`` is ssh refusing its host key, else None."""
    text = " ".join(text.split())
    if not _KEY_FAILED.search(text) and not _KEY_CHANGED.search(text) and not _KEY_UNKNOWN.search(text):
        return None
    changed = _KEY_CHANGED.search(text)
    if changed:
        m = _CHANGED_ADDR.search(text)
        addr = m.group("addr") if m else host
        where = _OFFENDING.search(text)
        known = where.group("file") if where else "~/.ssh/known_hosts"
        return (f"{host}: host key verification failed: the SSH host key of {addr} has CHANGED since {known} "
                f"recorded it (a reinstalled node, or someone in the middle); the play did not connect. If the "
                f"change is expected: ssh-keygen -f {known} -R {addr}, then ssh-keyscan {addr} >> {known} after "
                f"checking the fingerprint")
    unknown = _KEY_UNKNOWN.search(text)
    addr = unknown.group("addr") if unknown else host
    return (f"{host}: host key verification failed: the SSH host key of {addr} is not in known_hosts; the play did "
            f"not connect. Check its fingerprint, then: ssh-keyscan {addr} >> ~/.ssh/known_hosts ({_OPT_OUT})")


def _outcome(event: Mapping[str, Any]) -> HostOutcome | None:
    name = event.get("event")
    data = event.get("event_data") or {}
    host = data.get("host")
    if not host or name not in (_OK, _FAILED, _UNREACHABLE, _SKIPPED):
        return None
    res = data.get("res") or {}
    status = {_OK: "ok", _FAILED: "failed", _UNREACHABLE: "unreachable", _SKIPPED: "skipped"}[name]
    unreadable = None
    if isinstance(res, dict):
        res, unreadable = module_result(res)
    msg = res.get("msg") if isinstance(res, dict) else None
    if status == "ok" and unreadable:
        # Facts that cannot be read are missing evidence, as a module that failed.
        status, msg = "failed", f"the module's facts cannot be read: {unreadable}"
    if status == "failed" and isinstance(msg, str) and _TASK_TIMEOUT.search(msg):
        status = "timeout"
    if status == "failed" and data.get("ignore_errors"):
        status = "ignored"
    message = _one_line(msg) if msg else None
    if status == "unreachable" and isinstance(msg, str):
        message = host_key_message(str(host), msg) or message
    return HostOutcome(
        host=str(host),
        status=status,
        task=data.get("task"),
        result=res if isinstance(res, dict) else None,
        message=message,
        duration_s=data.get("duration"),
    )


def _one_line(text: Any, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    # ansible-core 2.19 prefixes every task error with this; it says nothing the status does not.
    text = text.removeprefix("Task failed: ")
    return text[:limit]


def run_playbook(
    playbook: str,
    inventory: Path,
    artifacts_to: RunDir | Path | None = None,
    *,
    artifacts_name: str = "ansible",
    extravars: Mapping[str, Any] | None = None,
    limit: str | None = None,
    forks: int = 20,
    check: bool = False,
    observer: Observer | None = None,
    keep_events: bool = True,
    timeout: int | None = None,
    cancel: threading.Event | None = None,
    hosts: int | None = None,
    host_key_checking: bool = True,
    once: bool = False,
) -> PlayResult:
    """Run one playbook and collect per-host outcomes from its events (``hosts``: how many, for progress).

    ansible-runner works in a private temporary directory that is removed afterwards. What is
    evidence goes, redacted, to ``artifacts_to``: a RunDir (into ``<run>/<artifacts_name>/``), or
    the directory inside a run directory where it should go (``rd.path / "ansible"``); None keeps
    nothing. ``host_key_checking`` given as False turns checking off for every host (a recorded
    choice); an inventory's ``k3fleet_host_key_checking`` set to false turns it off for its hosts.
    ``once``: the play connects to each host once (one module call per host): no ssh master
    connections, and :data:`FLEET_STRATEGY` unless the operator's environment names a strategy.
    """
    import ansible_runner.interface  # lazy: heavy, kept off the CLI's start-up path

    observer = observer or Observer()
    pb = playbook_path(playbook)
    inv = load_inventory(inventory, limit)
    result = PlayResult(playbook=playbook, status="error", rc=None)
    cancel = cancel or threading.Event()
    ours = ansible_env(host_key_checking=host_key_checking, persist=not once)
    # What runs the play: the operator's ANSIBLE_STRATEGY, ours for a play that connects once, else
    # Ansible's configured default (recorded in the play's runner summary, layout.RUNNER_SUMMARY).
    strategy = os.environ.get("ANSIBLE_STRATEGY") or (FLEET_STRATEGY if once else None)
    if once and strategy == FLEET_STRATEGY:
        ours["ANSIBLE_STRATEGY"] = FLEET_STRATEGY
    ours["PATH"] = _ansible_playbook_on_path()
    # Every process the play starts inherits this: when the play ends, however it ends, what is left
    # of it is found by it and stopped (k3fleet.audit.playprocs).
    token = new_token()
    ours[PLAY_ENV] = token
    unchecked = sorted(inv.hosts) if not host_key_checking else sorted(inv.host_key_opt_outs)
    evidence = _evidence_dir(artifacts_to, artifacts_name)
    if evidence is not None:
        _record_host_keys(*evidence, host_key_checking, inv.host_key_opt_outs)

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

    observer.play_started(playbook, hosts)
    started, cpu0 = time.monotonic(), _children_cpu()
    if cancel.is_set():
        # Stopped before the play began: start nothing.
        result.interrupted, result.status = True, "canceled"
        observer.play_finished(result)
        return result
    _sweep_private_dirs()
    # mkdtemp: mode 0700, a fresh name; ansible-runner's command record holds the environment.
    with tempfile.TemporaryDirectory(prefix=f"{_PRIVATE_PREFIX}{os.getpid()}-") as private:
        sources = [str(inv.path)]
        if host_key_checking and inv.host_key_opt_outs:
            sources.append(str(_unchecked_overlay(Path(private), inv.host_key_opt_outs, persist=not once)))
        runner_cmd: list[str] = []
        try:
            r = ansible_runner.interface.init_runner(
                private_data_dir=private,
                playbook=str(pb),
                inventory=sources if len(sources) > 1 else sources[0],
                extravars=dict(extravars or {}),
                limit=limit,
                forks=forks,
                cmdline="--check" if check else None,
                envvars=ours,
                quiet=True,
                event_handler=on_event,
                cancel_callback=cancel.is_set,
                timeout=timeout,
                suppress_env_files=True,
            )
            r.config.env = play_environment(r.config.env, ours)
            # The play runs where the operator is, as ansible-playbook by hand would: relative paths in
            # the inventory and on PATH mean what they say (ansible-runner would use its private dir).
            r.config.cwd = os.getcwd()
            runner_cmd = list(r.config.command or [])
            try:
                r.run()
            finally:
                # ansible-runner kills only the play's process group; its workers are sessions of
                # their own. A second Ctrl-C lands here with the play itself still running.
                result.stopped_processes = len(stop_play_uninterrupted(token))
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
            stdout = r.stdout.read() if r.stdout else ""
        except (OSError, ValueError):
            stdout = ""
        # Callers quote the tail in one-line errors: it is shown, so it is redacted.
        result.stderr_tail = redact_text(_tail(stdout))
        if evidence is not None:
            rd, rel = evidence
            rd.write_text(f"{rel}/{layout.RUNNER_STDOUT}", stdout)
            rd.write_json(f"{rel}/{layout.RUNNER_SUMMARY}", {
                "playbook": playbook, "inventory": str(inventory), "limit": limit, "check": check, "forks": forks,
                "argv": _argv_evidence(runner_cmd, private), "status": result.status, "rc": result.rc,
                "wall_s": round(result.wall_s, 3), "host_key_checking": host_key_checking,
                "stopped_processes": result.stopped_processes,
                "host_key_unchecked_hosts": unchecked,
                "strategy": strategy or "configured default",
                "ssh_master_connections": not once,
            })
    observer.play_finished(result)
    return result


_PRIVATE_PREFIX = "k3fleet-runner-"
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def stop_play_uninterrupted(token: str) -> list[int]:
    """``stop_play`` with the stop signals held back until it is done (a few seconds at most): one
    more Ctrl-C must not leave half the play's workers running."""
    if threading.current_thread() is not threading.main_thread():
        return stop_play(token)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return stop_play(token)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _sweep_private_dirs() -> None:
    """Remove private data directories a killed controller left behind (its pid is in the name):
    ansible-runner's record of the play's environment must not outlive the play."""
    base = Path(tempfile.gettempdir())
    for d in base.glob(f"{_PRIVATE_PREFIX}*-*"):
        pid = d.name[len(_PRIVATE_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if d.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (PermissionError, OSError):
            continue


def _argv_evidence(argv: Sequence[str], private: str) -> list[str]:
    """ansible-playbook's command line as evidence: the private directory named, not pathed, and
    extra vars by name only (their values are the run's own files: change.json, snapshots/)."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i > 0 and argv[i - 1] in ("-e", "--extra-vars") and arg.lstrip().startswith("{"):
            try:
                names = sorted(loads_json(arg))
            except (ValueError, TypeError):
                names = []
            out.append(f"<extra vars: {', '.join(names) or 'not JSON'}>")
            continue
        out.append(arg.replace(private, "<private-data-dir>"))
    return out


def _evidence_dir(artifacts_to: RunDir | Path | None, name: str) -> tuple[RunDir, str] | None:
    """The run directory and the relative folder a play's evidence goes to."""
    if artifacts_to is None:
        return None
    if isinstance(artifacts_to, RunDir):
        return artifacts_to, name
    target = Path(artifacts_to)
    # The nearest run directory above (or at) the given path receives the files, so the
    # redactor and the manifest see them; a path outside any run directory is its own root.
    for parent in (target, *target.parents):
        if (parent / COMMAND).is_file():
            return RunDir(parent), target.relative_to(parent).as_posix() if parent != target else name
    return RunDir(target.parent), target.name


def _record_host_keys(rd: RunDir, play: str, checking: bool, opt_outs: Mapping[str, str]) -> None:
    """Write the host-key policy of this play into the run's command.json (an explicit, kept
    choice), under the play's evidence folder: a resumed night adds its own entry."""
    if not (rd.path / COMMAND).is_file():
        return
    recorded = RunReader(rd.path).object(COMMAND).get("host_key_checking")
    policy = dict(recorded) if isinstance(recorded, dict) else {}
    policy[play] = {
        "default": "checked" if checking else "unchecked (--no-host-key-checking)",
        # host -> the inventory setting that turned checking off for it
        "unchecked_hosts": dict(sorted(opt_outs.items())) if checking else {},
    }
    rd.update_command(host_key_checking=policy)


def _unchecked_overlay(private: Path, opt_outs: Mapping[str, str], persist: bool = True) -> Path:
    """A second inventory source that turns checking off for the hosts whose inventory asks so.

    Per-host ssh arguments beat the environment's, so only these hosts connect unchecked (and
    through their own control sockets); ssh is what checks the key, Ansible only passes the option.
    """
    args = _ssh_args(False, persist)
    hostvars = {h: {"ansible_ssh_args": args, "ansible_control_path_dir": _UNCHECKED_CONTROL_DIR}
                for h in sorted(opt_outs)}
    path = private / "k3fleet-unchecked-hosts.yml"
    # JSON is YAML: no dumper needed, and host names with odd characters stay exact.
    path.write_text(json.dumps({"all": {"hosts": hostvars}}))
    return path


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
        slim["res"] = {k: v for k, v in res.items() if k not in (RESULT_KEY, RESULT_JSON_KEY, "invocation")}
        if RESULT_KEY in res or RESULT_JSON_KEY in res:
            slim["res"]["has_result"] = True
    out["event_data"] = slim
    return out
