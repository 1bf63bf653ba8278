# -*- coding: utf-8 -*-
# Stdlib only: this file is shipped to every node inside the AnsiballZ payload.
"""One way to read a node: files under a root prefix, commands through one runner.

Every collector receives a ``NodeReader``. It never touches ``/`` or ``PATH``
directly, so the same collector reads a real node (root ``/``), a containerised
view of a host (``/host``), a simulated lab host (a generated directory whose
``bin/`` replays recorded command output) or a test fixture tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

DEFAULT_TIMEOUT = 20.0
# Enough for any output a collector parses; protects the module from a runaway command.
MAX_OUTPUT = 4 * 1024 * 1024
READ_CHUNK = 64 * 1024


class CommandResult:
    """The outcome of one command: rc, stdout, stderr, and why it did not run."""

    __slots__ = ("argv", "rc", "stdout", "stderr", "error", "duration")

    def __init__(self, argv: Iterable[str], rc: int | None, stdout: str, stderr: str, error: str | None = None,
                 duration: float = 0.0) -> None:
        self.argv: list[str] = list(argv)
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        # "not_found", "timeout", "budget", "exec_error" or None when the command ran.
        self.error = error
        self.duration = duration

    @property
    def ok(self) -> bool:
        return self.error is None and self.rc == 0

    def reason(self) -> str:
        """A one-line explanation fit for an ``unknown`` fact."""
        cmd = " ".join(self.argv)
        if self.error == "not_found":
            return "%s: command not found" % self.argv[0]
        if self.error == "timeout":
            return "%s: timed out after %.1fs" % (cmd, self.duration)
        if self.error == "budget":
            return "%s: not run: the node's time budget was spent" % cmd
        if self.error:
            return "%s: %s" % (cmd, self.stderr.strip() or self.error)
        detail = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return "%s: exit %s%s" % (cmd, self.rc, (": " + detail[0][:200]) if detail else "")

    def as_dict(self) -> dict[str, Any]:
        return {"argv": self.argv, "rc": self.rc, "error": self.error,
                "stderr": self.stderr[-500:], "duration": round(self.duration, 3)}


class NodeReader:
    """Reads files under ``root`` and runs commands found on ``path``.

    ``procfs`` and ``sysfs`` may be moved independently of ``root``: a simulated
    driver writes its /proc view elsewhere, as a containerised exporter reads
    the host's /proc at /host/proc.
    """

    def __init__(self, root: str = "/", path: str | None = None, procfs: str | None = None, sysfs: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, env: Mapping[str, str] | None = None,
                 budget: float | None = None) -> None:
        self.root = root or "/"
        self.procfs = procfs or self.join_root("/proc")
        self.sysfs = sysfs or self.join_root("/sys")
        if path is None:
            path = os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        self.path = path
        self.timeout = float(timeout)
        self._env = env
        self.commands: list[dict[str, Any]] = []
        self._cache: dict[tuple[str, ...], CommandResult] = {}
        # Files several collectors read (/proc/modules, /etc/hostname) and command lookups on the
        # path: each read and looked up once per reader, however many collectors ask.
        self._files: dict[tuple[str, int], str | None] = {}
        self._which: dict[str, str | None] = {}
        # The whole node's time budget: once spent, commands are not started and say so, so the
        # module returns partial facts before the controller's task timeout kills it.
        self.deadline: float | None = time.time() + float(budget) if budget else None

    # -- files -------------------------------------------------------------
    def join_root(self, path: str) -> str:
        if self.root == "/":
            return path
        return os.path.join(self.root, path.lstrip("/"))

    def resolve(self, path: str) -> str:
        """Map an absolute node path to where it lives for this reader."""
        if path == "/proc" or path.startswith("/proc/"):
            return self.procfs + path[len("/proc"):]
        if path == "/sys" or path.startswith("/sys/"):
            return self.sysfs + path[len("/sys"):]
        return self.join_root(path)

    def read(self, path: str, limit: int = MAX_OUTPUT) -> str | None:
        """Return the file's text, or None when it does not exist or cannot be read."""
        # Read in small chunks: some procfs/sysfs files refuse one large read (ENOMEM).
        chunks: list[bytes] = []
        size = 0
        try:
            with open(self.resolve(path), "rb") as fh:
                while size < limit:
                    chunk = fh.read(min(READ_CHUNK, limit - size))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
        except (IOError, OSError):
            return None
        return b"".join(chunks).decode("utf-8", "replace")

    def read_cached(self, path: str, limit: int = MAX_OUTPUT) -> str | None:
        """:meth:`read` once per reader, however many collectors ask for the file."""
        key = (path, limit)
        if key not in self._files:
            self._files[key] = self.read(path, limit=limit)
        return self._files[key]

    def read_error(self, path: str) -> str | None:
        """Why ``path`` cannot be read (for ``unknown`` reasons), or None if it can."""
        try:
            with open(self.resolve(path), "rb"):
                return None
        except (IOError, OSError) as exc:
            return "%s: %s" % (path, exc.strerror or exc)

    def exists(self, path: str) -> bool:
        return os.path.exists(self.resolve(path))

    def listdir(self, path: str) -> list[str] | None:
        try:
            return sorted(os.listdir(self.resolve(path)))
        except (IOError, OSError):
            return None

    def glob_names(self, path: str, prefix: str) -> list[str]:
        names = self.listdir(path) or []
        return [n for n in names if n.startswith(prefix)]

    # -- commands ----------------------------------------------------------
    def which(self, name: str) -> str | None:
        if name not in self._which:
            self._which[name] = self._find(name)
        return self._which[name]

    def _find(self, name: str) -> str | None:
        if os.sep in name:
            return name if os.access(name, os.X_OK) else None
        for d in self.path.split(os.pathsep):
            if not d:
                continue
            cand = os.path.join(d, name)
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
        return None

    def env(self) -> dict[str, str]:
        env = dict(self._env if self._env is not None else os.environ)
        # Parsers expect C-locale output (decimal points, English messages).
        env["LC_ALL"] = "C"
        env["LANG"] = "C"
        env["PATH"] = self.path
        return env

    def run_cached(self, argv: Iterable[object], timeout: float | None = None) -> CommandResult:
        """Run a read-only command once per reader, however many collectors ask for it."""
        key = tuple(str(a) for a in argv)
        if key not in self._cache:
            self._cache[key] = self.run(argv, timeout=timeout)
        return self._cache[key]

    def run(self, argv: Iterable[object], timeout: float | None = None, stdin: str | None = None,
            cwd: str | None = None, env: Mapping[str, str] | None = None) -> CommandResult:
        """Run ``argv`` with C locale and a timeout (in ``cwd`` when given: apt-get download writes
        there), ``env`` added to the environment. Never raises."""
        words = [str(a) for a in argv]
        timeout = self.timeout if timeout is None else float(timeout)
        started = time.time()
        if self.deadline is not None:
            left = self.deadline - started
            if left <= 0:
                res = CommandResult(words, None, "", "", error="budget")
                self.commands.append(res.as_dict())
                return res
            timeout = min(timeout, left)
        exe = self.which(words[0])
        if exe is None:
            res = CommandResult(words, None, "", "", error="not_found")
            self.commands.append(res.as_dict())
            return res
        try:
            proc = subprocess.Popen([exe] + words[1:], stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=dict(self.env(), **(env or {})),
                                    close_fds=True, start_new_session=True, cwd=cwd)
        except (IOError, OSError) as exc:
            res = CommandResult(words, None, "", str(exc), error="exec_error", duration=time.time() - started)
            self.commands.append(res.as_dict())
            return res
        try:
            out, err = proc.communicate(input=stdin.encode("utf-8") if stdin else None, timeout=timeout)
        except subprocess.TimeoutExpired:
            # Kill the whole group: a wrapper's child holding stdout open would otherwise keep us waiting.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (IOError, OSError):
                proc.kill()
            out, err = proc.communicate()
            res = CommandResult(words, None, out[:MAX_OUTPUT].decode("utf-8", "replace"),
                                err[-MAX_OUTPUT:].decode("utf-8", "replace"), error="timeout",
                                duration=time.time() - started)
            self.commands.append(res.as_dict())
            return res
        res = CommandResult(words, proc.returncode, out[:MAX_OUTPUT].decode("utf-8", "replace"),
                            err[-MAX_OUTPUT:].decode("utf-8", "replace"), duration=time.time() - started)
        self.commands.append(res.as_dict())
        return res


def parse_proc_modules(text: str | None) -> dict[str, dict[str, Any]]:
    """Parse /proc/modules into ``{name: {"size", "refcount", "state"}}``.

    Lines that are not module lines (a short read) are skipped: presence is all the
    collectors need (the driver's module, GPUDirect's peer-memory module), and a half
    line cannot name a module reliably.
    """
    modules: dict[str, dict[str, Any]] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) < 5 or not parts[1].isdigit():
            continue
        modules[parts[0]] = {
            "size": int(parts[1]),
            "refcount": int(parts[2]) if parts[2].isdigit() else None,
            "state": parts[4],
        }
    return modules


def unknown(reason: str | None, **extra: Any) -> dict[str, Any]:
    """The shape every collector uses for a fact it could not establish."""
    out: dict[str, Any] = {"status": "unknown", "reason": reason}
    out.update(extra)
    return out


def settled(facts: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """``facts`` with its verdict: ``unknown`` with the problems as the reason, ``ok`` when there are none."""
    facts["status"] = "unknown" if problems else "ok"
    facts["reason"] = "; ".join(problems) or None
    return facts


def guard(section: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run one collector; a bug or surprise in it becomes data, not a crashed audit."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any collector failure must become a fact
        return unknown("%s collector failed: %s: %s" % (section, type(exc).__name__, exc))
