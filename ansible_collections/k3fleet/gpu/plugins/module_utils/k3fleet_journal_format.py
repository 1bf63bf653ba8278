# -*- coding: utf-8 -*-
# Stdlib only: the journal module runs it (delegated to the controller's own Python), and the
# controller package imports it, so the format rules live in this one place.
# ruff: noqa: UP001, UP009, UP010, UP031
"""The change journal's line format: how a line is appended, split, recovered and attributed.

One JSON object per line, always beginning ``{"ts": `` (the writer puts ``ts`` first), ended by
``\\n``. Lines are appended under an exclusive ``flock`` and fsync'd.

Tearing (docs/change-night.md "Journal"): a writer killed mid-line (power loss, SIGKILL) leaves
an unterminated tail. The next append first terminates that tail with a newline, so the torn
text stays a line of its own and is never merged with the new one; the append reports where the
torn text starts. A reader that meets a line that does not parse looks for a complete line
after it inside the same text (a journal torn by an older writer may have merged them), so the
line after a torn one is never lost; the torn part is reported with its byte offset and, when
its text still names it, the host it belonged to.

Slots (``gate``): before a host is taken out of service, the journal itself decides, under the
same lock, whether the change may take one more node out (``max_unavailable``) and whether the
failures so far still allow it (``failure_budget``, a failed canary).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_redact import redact

# The stages a host's journal lines name (the way through a good night first, then failed, rolled_back
# and held): the one list. The module's stage choices and the controller's journal reader take it from
# here; a unit test holds the module's documented choices equal to it.
STAGES = ("snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "returned", "failed",
          "rolled_back", "held")
# Every line the writer produces starts with these bytes (json.dumps of a dict whose first key is ts).
LINE_START = b'{"ts": '
# Stages after which the node is out of service because of the change, until a later line says
# otherwise: the slot is taken with the snapshot line, right before the drain.
OUT_STAGES = ("snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "failed")
# Stages after which the host's packages or loaded driver may differ from the snapshot.
TOUCHED_STAGES = ("upgrading", "rebooting", "verifying")
# Stages that say the change did something to the host (so its snapshot matters).
CHANGED_STAGES = ("draining", "drained", "upgrading", "rebooting", "verifying", "failed", "rolled_back")
_HOST_RE = re.compile(r'"host": "((?:[^"\\]|\\.)*)"')
_STAGE_RE = re.compile(r'"stage": "([a-z_]+)"')
_CHANGE_RE = re.compile(r'"change_id": "((?:[^"\\]|\\.)*)"')
# How far back an append looks for the start of a torn tail (a snapshot line is a few kB).
_TAIL_WINDOW = 1 << 20


def _unescape(text: str) -> Any:
    try:
        return json.loads('"%s"' % text)
    except ValueError:
        return text


def attribute(fragment: bytes | str) -> tuple[Any, str | None, Any]:
    """``(host, stage, change_id)`` named in the text of a line that does not parse, each or None."""
    text = fragment.decode("utf-8", "replace") if isinstance(fragment, bytes) else fragment
    host = _HOST_RE.search(text)
    stage = _STAGE_RE.search(text)
    change = _CHANGE_RE.search(text)
    return (_unescape(host.group(1)) if host else None,
            stage.group(1) if stage and stage.group(1) in STAGES else None,
            _unescape(change.group(1)) if change else None)


def _load(chunk: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(chunk.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def split_lines(raw: bytes) -> list[tuple[int, str, dict[str, Any]]]:
    """Every line of a journal's bytes, in order, as ``(offset, kind, value)``.

    ``kind`` is ``"line"`` with the decoded object, or ``"torn"`` with a dict
    ``{length, host, stage, change_id, why}`` for text that is not a whole line (the object of
    a recovered line follows as its own ``"line"``). ``offset`` is the byte offset in the file.
    """
    out: list[tuple[int, str, dict[str, Any]]] = []
    pos = 0
    size = len(raw)
    while pos < size:
        nl = raw.find(b"\n", pos)
        end = size if nl < 0 else nl
        chunk = raw[pos:end]
        if chunk.strip():
            out.extend(_split_chunk(chunk, pos, terminated=nl >= 0))
        pos = end + 1
    return out


def _split_chunk(chunk: bytes, offset: int, terminated: bool) -> list[tuple[int, str, dict[str, Any]]]:
    data = _load(chunk)
    if data is not None:
        return [(offset, "line", data)]
    # A torn line merged with the one after it: the complete line is the longest suffix that
    # starts like a line and parses.
    start = chunk.find(LINE_START, 1)
    while start > 0:
        data = _load(chunk[start:])
        if data is not None:
            return [(offset, "torn", _torn(chunk[:start], "torn line merged with the next one")),
                    (offset + start, "line", data)]
        start = chunk.find(LINE_START, start + 1)
    why = ("unterminated last line (the writer stopped mid-line)" if not terminated
           else "torn line (not a whole JSON object)")
    return [(offset, "torn", _torn(chunk, why))]


def _torn(fragment: bytes, why: str) -> dict[str, Any]:
    host, stage, change_id = attribute(fragment)
    return {"length": len(fragment), "host": host, "stage": stage, "change_id": change_id, "why": why}


def _torn_tail_start(fd: int, size: int) -> int:
    """Offset where the unterminated last line of the file starts."""
    window = min(size, _TAIL_WINDOW)
    os.lseek(fd, size - window, os.SEEK_SET)
    tail = b""
    while len(tail) < window:
        part = os.read(fd, window - len(tail))
        if not part:
            break
        tail += part
    nl = tail.rfind(b"\n")
    return size - window + nl + 1 if nl >= 0 else size - window


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    parts: list[bytes] = []
    while True:
        part = os.read(fd, 1 << 20)
        if not part:
            break
        parts.append(part)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class Journal:
    """One journal file opened for appending under its lock (a context manager)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1
        self.created = False

    def __enter__(self) -> Journal:
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            os.makedirs(directory)
        self.created = not os.path.exists(self.path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        # Forks write for different hosts at once; a snapshot line can exceed PIPE_BUF.
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
        if self.created:
            dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return False

    def read(self) -> bytes:
        return _read_all(self.fd)

    def append(self, line: Mapping[str, Any]) -> dict[str, int] | None:
        """Append one whole line and make it durable. Returns the torn tail it terminated first
        (``{"offset", "length"}``), or None. The journal is evidence: the line passes the redactor
        (a drain reason or a snapshot may carry a secret), keys and their order kept."""
        data = (json.dumps(redact(line), sort_keys=False, default=str) + "\n").encode("utf-8")
        size = os.fstat(self.fd).st_size
        torn = None
        if size > 0:
            os.lseek(self.fd, size - 1, os.SEEK_SET)
            if os.read(self.fd, 1) != b"\n":
                start = _torn_tail_start(self.fd, size)
                torn = {"offset": start, "length": size - start}
                data = b"\n" + data
        _write_all(self.fd, data)
        os.fsync(self.fd)
        return torn


def append_line(path: str, line: Mapping[str, Any]) -> dict[str, int] | None:
    """Append one line to the journal at ``path`` (see ``Journal.append``)."""
    with Journal(path) as journal:
        return journal.append(line)


# -- slots ---------------------------------------------------------------------------------------


def _is_out(stage: object, detail: object) -> bool:
    if stage in OUT_STAGES or stage == "unreadable":
        return True
    if stage == "rolled_back":
        return bool(isinstance(detail, dict) and detail.get("left_drained"))
    return False


def slot_state(raw: bytes, change_id: str) -> tuple[dict[str, str], list[str]]:
    """From a journal's bytes, for one change id: hosts out of service now (host -> last stage)
    and hosts that failed. A torn line that names a host counts that host as out: a journal
    that cannot be read never under-counts."""
    last: dict[str, tuple[Any, Any]] = {}
    failed: list[str] = []
    for _offset, kind, value in split_lines(raw):
        if kind == "torn":
            if value["host"] and value["change_id"] in (None, change_id):
                last[value["host"]] = ("unreadable", None)
            continue
        if value.get("change_id") != change_id:
            continue
        host, stage = value.get("host"), value.get("stage")
        if not isinstance(host, str) or value.get("interrupted"):
            # A line saying a signal stopped the play repeats the host's stage: it changes nothing.
            continue
        if stage == "failed" and host not in failed:
            failed.append(host)
        last[host] = (stage, value.get("detail"))
    out: dict[str, str] = {}
    for h, (st, detail) in last.items():
        if _is_out(st, detail):
            # A failure outside the rollback is followed by the rollback, still under way.
            rolling = st == "failed" and not (isinstance(detail, dict) and detail.get("at") == "rollback")
            out[h] = "failed, rolling back" if rolling else st
    return out, failed


# Stages a host that holds its slot may still be moving through; the others (a failed rollback,
# rolled back and left drained, unreadable) will not give their slot back during this night.
_IN_FLIGHT = ("snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "failed, rolling back")


def slot_decision(out: Mapping[str, str], failed: Sequence[str], host: str,
                  gate: Mapping[str, Any]) -> tuple[str, str]:
    """``("grant" | "wait" | "deny", why)`` for ``host`` asking to be taken out of service."""
    if host in out:
        return "grant", "already out of service for this change (%s)" % out[host]
    canary = gate.get("canary")
    if canary and canary != host and canary in failed:
        return "deny", "the canary %s failed: the waves stop" % canary
    budget = int(gate.get("failure_budget") or 0)
    if len(failed) > budget:
        return "deny", "failure budget spent: %d host(s) failed (%s), budget %d" % (
            len(failed), ", ".join(failed), budget)
    limit = int(gate["max_unavailable"])
    if len(out) < limit:
        return "grant", "%d of %d node(s) out of service" % (len(out) + 1, limit)
    moving = sorted(h for h, st in out.items() if st in _IN_FLIGHT)
    if not moving:
        return "deny", "max-unavailable %d reached by node(s) left out of service: %s" % (
            limit, ", ".join(sorted(out)))
    return "wait", "max-unavailable %d reached (%s)" % (limit, ", ".join(sorted(out)))


# -- the operator in the loop (docs/change-night.md "Pauses") -----------------------------------------

PAUSE_AFTER = ("canary", "each-host", "wave")


def returned_hosts(raw: bytes, change_id: str) -> list[str]:
    """Hosts of ``change_id`` whose last line is ``returned``, in the order they returned."""
    last: dict[str, Any] = {}
    order: list[str] = []
    for _offset, kind, value in split_lines(raw):
        if kind == "torn" or value.get("change_id") != change_id or value.get("interrupted"):
            continue
        host = value.get("host")
        if not isinstance(host, str):
            continue
        last[host] = value.get("stage")
        if value.get("stage") == "returned" and host not in order:
            order.append(host)
    return [h for h in order if last.get(h) == "returned"]


def pause_tokens(after: str, batches: Sequence[Sequence[str]], host: str, returned: Sequence[str]) -> list[str]:
    """The continue tokens ``host`` needs before it may take a slot: the night pauses ``after`` the canary
    (its batch), each wave (batch) or each host that returned to service."""
    index = next((i for i, b in enumerate(batches) if host in b), 0)
    if after == "canary":
        return ["after-batch-0"] if index > 0 else []
    if after == "wave":
        return ["after-batch-%d" % (index - 1)] if index > 0 else []
    if after == "each-host":
        return ["after-host-%s" % h for h in returned if h != host]
    return []


def pause_decision(raw: bytes, change_id: str, host: str, pause: Mapping[str, Any] | None) -> str | None:
    """None when ``host`` may go on, else why it waits (the first continue token missing)."""
    if not pause or not pause.get("after"):
        return None
    returned = returned_hosts(raw, change_id)
    for token in pause_tokens(pause["after"], pause.get("batches") or [], host, returned):
        if not os.path.exists(os.path.join(pause["dir"], token)):
            return "paused (%s): continue with k3fleet upgrade --continue, or touch %s" % (
                token, os.path.join(pause["dir"], token))
    return None


def take_slot(path: str, line: dict[str, Any], gate: Mapping[str, Any], now: Callable[[], float] = time.time,
              sleep: Callable[[float], None] = time.sleep, stamp: Callable[[], str] | None = None,
              ) -> tuple[bool, str, dict[str, int] | None, float, dict[str, Any]]:
    """Append ``line`` only when ``gate`` allows this host out of service; wait while the change's
    other hosts hold every slot. Returns ``(granted, why, torn, waited_s, line)``: the line as
    written (with the slot it took in its detail)."""
    started = now()
    deadline = started + float(gate.get("wait_timeout") or 0)
    poll = float(gate.get("poll") or 2.0)
    while True:
        with Journal(path) as journal:
            raw = journal.read()
            out, failed = slot_state(raw, line["change_id"])
            verdict, why = slot_decision(out, failed, line["host"], gate)
            paused = pause_decision(raw, line["change_id"], line["host"], gate.get("pause")) if (
                verdict == "grant" and line["host"] not in out) else None
            if paused is not None:
                verdict, why = "wait", paused
            if verdict == "grant":
                # The line says when the slot was taken, not when the host started asking for it.
                line = dict(line, ts=stamp()) if stamp is not None else dict(line)
                raw_detail = line.get("detail")
                detail: dict[str, Any] = raw_detail if isinstance(raw_detail, dict) else {}
                detail = dict(detail, slot={"out": sorted(set(out) | set([line["host"]])),
                                            "max_unavailable": int(gate["max_unavailable"]),
                                            "waited_s": round(now() - started, 1)})
                line["detail"] = detail
                torn = journal.append(line)
                return True, why, torn, round(now() - started, 1), line
        if verdict == "deny":
            return False, why, None, round(now() - started, 1), line
        if now() >= deadline:
            why = "%s: no slot within %ds" % (why, int(gate.get("wait_timeout") or 0))
            return False, why, None, round(now() - started, 1), line
        sleep(poll)
