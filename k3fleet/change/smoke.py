"""The change night's serving smoke as the controller chooses it (docs/change-night.md "Serving smoke").

``k3fleet upgrade`` runs it by default (``--no-smoke`` skips it, with a warning in the result and
run.json); ``--launch-file PATH`` gives the command the smoke runs inside the image instead of the
audit's serve command. The choice goes into change.json (``smoke``) and reaches the play as one
extra var, ``k3fleet_smoke``: its two bounds from the target (``change.smoke_ready_timeout_s``,
``change.smoke_request_timeout_s``) and the launch file's path, or null for no smoke. The role
``k3_verify`` runs it (``tasks/smoke.yml``), never in ``--check`` and never in a rollback.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import Path
from typing import Any

from k3fleet.bounds import read_input
from k3fleet.change.gate import UpgradeOptions
from k3fleet.change.record import ChangeRecord, SmokeChoice
from k3fleet.errors import UsageError
from k3fleet.models.target import Target, is_multi_node

SKIPPED = ("the night skips the serving smoke (--no-smoke): no changed host is shown to start the target's image "
           "and answer a chat request before it goes back into service")

# As the role reads a launch file (k3_verify vars/main.yml): comment lines dropped, continued lines
# joined, leading NAME=VALUE words are the server's environment.
_COMMENT = re.compile(r"(?m)^[ \t]*#.*$")
_CONTINUATION = re.compile(r"\\[ \t]*\r?\n")
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_RUNTIMES = ("docker", "podman", "nerdctl")


def launch_words(text: str, label: str) -> list[str]:
    """The command of a launch file as words, its environment prefix left out; a command that
    cannot be run inside the image is one UsageError line."""
    joined = _CONTINUATION.sub(" ", _COMMENT.sub("", text)).strip()
    try:
        words = shlex.split(joined, comments=False, posix=True)
    except ValueError as exc:
        raise UsageError(f"{label} cannot be read as a shell command ({exc}): give the command run inside the "
                         "image, for example vllm serve MODEL --tensor-parallel-size 8") from exc
    while words and _ENV_WORD.match(words[0]):
        words.pop(0)
    if not words:
        raise UsageError(f"{label} holds no command: give the command run inside the image, for example "
                         "vllm serve MODEL --tensor-parallel-size 8")
    if words[0].rsplit("/", 1)[-1] in _RUNTIMES and words[1:2] == ["run"]:
        raise UsageError(f"{label} is a `{words[0]} run` line: give the command run inside the image (vllm serve "
                         "MODEL ...); the smoke starts the container itself")
    return words


def read_launch_file(path: Path) -> str:
    """The sha256 of the launch file at ``path`` after checking it the way the role will read it
    (a regular UTF-8 text file under the record cap, one command run inside the image)."""
    label = f"--launch-file {path}"
    raw = read_input(path, "--launch-file", kind="a launch command file", limit="record", text=True)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{label} is not UTF-8 text (byte {exc.start}): give the launch command as text") from exc
    launch_words(text, label)
    return hashlib.sha256(raw).hexdigest()


def _given(path: Path) -> SmokeChoice:
    return SmokeChoice(enabled=True, launch_file=str(Path(path).resolve()), launch_file_sha256=read_launch_file(path))


def smoke_choice(opts: UpgradeOptions) -> SmokeChoice:
    """A fresh night's smoke: on unless ``--no-smoke``, with ``--launch-file`` checked now, before
    anything runs."""
    if opts.smoke is False:
        if opts.launch_file is not None:
            raise UsageError("--launch-file is the serving smoke's command and --no-smoke skips the smoke: drop one")
        return SmokeChoice(enabled=False)
    return _given(opts.launch_file) if opts.launch_file is not None else SmokeChoice(enabled=True)


def resumed_smoke(opts: UpgradeOptions, recorded: SmokeChoice | None) -> SmokeChoice:
    """A resume's smoke: as the night was started (``recorded``; none recorded: off) unless the command
    line says otherwise. A recorded launch file is used only while it is unchanged."""
    if opts.smoke is False or opts.launch_file is not None:
        return smoke_choice(opts)
    if opts.smoke is None and (recorded is None or not recorded.enabled):
        return SmokeChoice(enabled=False)
    if recorded is None or recorded.launch_file is None:
        return SmokeChoice(enabled=True)
    path = Path(recorded.launch_file)
    now = read_launch_file(path)
    if now != recorded.launch_file_sha256:
        raise UsageError(f"--launch-file {path} changed since the night started (sha256 {now[:12]}, recorded "
                         f"{str(recorded.launch_file_sha256)[:12]}): give --launch-file {path} again to run it as it "
                         "is now, or --no-smoke")
    return recorded


def one_node_problem(choice: SmokeChoice, strategy: Any) -> str | None:
    """Why the smoke cannot run the audit's serve command on one host, or None. Each changed host runs
    the smoke alone; when the audit's strategy spans nodes (data, pipeline or expert parallel over
    nodes: one node's GPU memory does not hold the weights) the command fails to load or waits for
    peers that never come, the ready timeout fails the host, and a good driver change is rolled back.
    ``strategy`` is the verdict's StrategyDecision (or None)."""
    if not choice.enabled or choice.launch_file is not None or strategy is None:
        return None
    if not is_multi_node(strategy.strategy):
        return None
    return (f"the audit's serving strategy {strategy.strategy} spans nodes, and the serving smoke starts the image "
            "on one changed host at a time: give --launch-file with a command one node can serve (for example "
            "vllm serve MODEL --tensor-parallel-size 8 with a model that fits the node), or --no-smoke")


def check_one_node(choice: SmokeChoice, strategy: Any, *, check: bool) -> list[str]:
    """A night that changes nodes refuses a smoke one host cannot run (one UsageError line, before any
    node is touched); ``--check``, which never runs the smoke, reports it as a warning instead."""
    problem = one_node_problem(choice, strategy)
    if problem is None:
        return []
    if check:
        return [f"the night would be refused: {problem}"]
    raise UsageError(problem)


def smoke_timeouts(target: Target) -> dict[str, int]:
    """The smoke's two bounds from the target, in seconds (``change`` section)."""
    c = target.change
    return {"smoke_ready": int(c.smoke_ready_timeout_s), "smoke_request": int(c.smoke_request_timeout_s)}


def smoke_extravar(record: ChangeRecord) -> dict[str, Any] | None:
    """``k3fleet_smoke`` for the play: the bounds and the launch file, or None for no smoke."""
    s = record.smoke
    if s is None or not s.enabled:
        return None
    t = record.timeouts
    ev: dict[str, Any] = {"ready_timeout": int(t["smoke_ready"]), "request_timeout": int(t["smoke_request"])}
    if s.launch_file is not None:
        ev["launch_file"] = s.launch_file
    return ev


def smoke_warnings(choice: SmokeChoice, check: bool) -> list[str]:
    """The result's warning for a night that changes nodes without the smoke (--check never runs it)."""
    return [] if check or choice.enabled else [SKIPPED]


def describe(change: dict[str, Any]) -> str | None:
    """One line for the result: what the smoke ran, or that it was skipped; None for a night with no
    recorded choice."""
    s = change.get("smoke")
    if not isinstance(s, dict):
        return None
    if not s.get("enabled"):
        return "serving smoke: off (--no-smoke)"
    t = change.get("timeouts") or {}
    what = f"launch file {s['launch_file']}" if s.get("launch_file") else "the audit's serve command"
    # A night that planned no host has no timeouts.
    bounds = (f", ready within {t['smoke_ready']}s, {t['smoke_request']}s per request"
              if "smoke_ready" in t and "smoke_request" in t else "")
    return f"serving smoke: on, {what}{bounds}"
