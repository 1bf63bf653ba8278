"""Command replay for lab hosts: one small POSIX sh script answers from recordings.

Every tool a lab host has is ``<root>/bin/<tool>``, the same script. A recording is keyed by
its full argument list: the md5 of the tool name and each argument, each followed by a
newline (:func:`replay_key`). It lives in ``<root>/.replay/<tool>/<key>.out`` (always
present, maybe empty), with optional ``.err``, ``.rc`` (exit status when not 0) and
``.sleep`` (seconds, to simulate a slow or hung command). An argument list without a
recording prints ``<tool>: no lab recording for: <args>`` on stderr and exits 2.

The script runs about fifteen times per host per audit and stands in for a real command,
which is one exec, so it costs one too: the shell itself. ``<root>/.replay/<tool>/index``
(:func:`replay_index`) is a ``case`` over every recorded argument list, matched literally
against the arguments joined by newlines; a recording without a sleep answers from
``<key>.sh`` (:func:`answer_script`: its stdout, stderr and status as ``printf`` and ``exit``,
sourced by the shell, byte for byte what ``.out`` and ``.err`` hold), one with a sleep is
named by the index and played from its files. Only an argument list the index does not know
computes the md5 (``md5sum``) to look for a recording by key. The script finds the host root
from its own path, never from PATH, which on a lab host is the lab's bin directory alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

REPLAY_DIR = ".replay"
NO_RECORDING_RC = 2
# Per tool: the argument lists it has recordings for (see replay_index).
INDEX = "index"

_SCRIPT = """\
#!/bin/sh
# k3fleet lab replay: answers with the recording made for this exact argument list.
t=${0##*/}
case $0 in */*) b=${0%/*} ;; *) b=. ;; esac
case $b in */*) r=${b%/*} ;; *) r=. ;; esac
d=$r/.replay/$t
# The index answers a recorded argument list from its <key>.sh (and exits), or names it in f.
k=$t
for a do
  k="$k
$a"
done
f=
[ -f "$d/index" ] && . "$d/index"
if [ -z "$f" ]; then
  k=$(printf '%s\\n' "$t" "$@" | @MD5SUM@)
  f=${k%% *}
fi
f=$d/$f
if [ ! -f "$f.out" ]; then
  printf '%s: no lab recording for: %s\\n' "$t" "$*" >&2
  exit 2
fi
if [ -f "$f.sleep" ]; then
  read -r s < "$f.sleep"
  if [ ! -s "$f.out" ] && [ ! -s "$f.err" ] && [ ! -f "$f.rc" ]; then
    # A pure hang: become the sleep, so a caller's kill on timeout ends it for good.
    exec @SLEEP@ "$s"
  fi
  # Detached from our pipes: a caller that kills us on timeout gets EOF at once.
  @SLEEP@ "$s" </dev/null >/dev/null 2>&1
fi
[ -s "$f.out" ] && @CAT@ "$f.out"
[ -s "$f.err" ] && @CAT@ "$f.err" >&2
rc=0
[ -f "$f.rc" ] && read -r rc < "$f.rc"
exit "$rc"
"""


class LabToolError(RuntimeError):
    """A tool the replay script needs is missing on this machine."""


def system_tool(name: str, who: str = "lab replay") -> str:
    """The absolute path of a system tool a lab script runs: inside the script PATH is the lab's bin,
    where these do not exist."""
    found = shutil.which(name, path="/usr/bin:/bin")
    if found is None:
        raise LabToolError(f"{who} needs {name} in /usr/bin or /bin; it was not found")
    return found


def replay_script() -> str:
    return (_SCRIPT.replace("@MD5SUM@", system_tool("md5sum"))
            .replace("@SLEEP@", system_tool("sleep"))
            .replace("@CAT@", system_tool("cat")))


def _parts(argv: Sequence[str]) -> list[str]:
    return [os.path.basename(str(argv[0])), *(str(a) for a in argv[1:])]


def replay_key(argv: Sequence[str]) -> str:
    """The recording key of a command line, as the replay script computes it."""
    data = "".join(part + "\n" for part in _parts(argv)).encode("utf-8")
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _sh_quote(data: bytes) -> bytes:
    """``data`` as one single-quoted sh word: every byte literal, ``'`` written as ``'\\''``."""
    return b"'" + data.replace(b"'", b"'\\''") + b"'"


def answer_script(stdout: bytes, stderr: bytes, rc: int) -> bytes | None:
    """The sh the replay sources to answer one recording without starting a process: ``printf``
    (a shell builtin) of each stream, then ``exit``. None where sh cannot carry the bytes (NUL):
    that recording is played from its files."""
    if b"\0" in stdout or b"\0" in stderr:
        return None
    lines = []
    if stdout:
        lines.append(b"printf '%s' " + _sh_quote(stdout))
    if stderr:
        lines.append(b"printf '%s' " + _sh_quote(stderr) + b" >&2")
    lines.append(b"exit %d" % rc)
    return b"\n".join(lines) + b"\n"


def recording_files(argv: Sequence[str], stdout: str, stderr: str = "", rc: int = 0,
                    sleep: float = 0.0) -> dict[str, bytes]:
    """The files (relative to the tool's replay directory) that record one command line: ``.out``
    and the others as the module docstring says, and ``.sh`` (:func:`answer_script`) unless it sleeps."""
    key = replay_key(argv)
    out, err = stdout.encode("utf-8"), stderr.encode("utf-8")
    files = {f"{key}.out": out}
    if stderr:
        files[f"{key}.err"] = err
    if rc:
        files[f"{key}.rc"] = f"{rc}\n".encode()
    if sleep:
        files[f"{key}.sleep"] = f"{sleep:g}\n".encode()
    else:
        script = answer_script(out, err, rc)
        if script is not None:
            files[f"{key}.sh"] = script
    return files


def replay_index(recordings: Mapping[tuple[str, ...], Mapping[str, bytes]]) -> bytes:
    """One tool's index: a ``case`` over the recorded argument lists (``argv`` -> the files
    :func:`recording_files` made for it), each pattern the tool name and arguments joined by
    newlines in single quotes (matched literally). A recording with a ``.sh`` is answered by
    sourcing it; any other is named (``f=<key>``) for the script to play from its files."""
    lines = [b"# k3fleet lab replay index: generated from the recordings beside it (k3fleet.lab.replay).",
             b"case $k in"]
    for argv in sorted(recordings):
        key = replay_key(argv)
        pattern = _sh_quote("\n".join(_parts(argv)).encode("utf-8"))
        action = (b'. "$d/' + key.encode() + b'.sh"' if f"{key}.sh" in recordings[argv]
                  else b"f=" + key.encode())
        lines.append(pattern + b") " + action + b" ;;")
    lines.append(b"esac")
    return b"\n".join(lines) + b"\n"


class Store:
    """Content-addressed directory trees shared between lab hosts by symlink.

    A thousand hosts cut from nine profiles hold a handful of distinct trees; each is
    written once under ``<dest>/.store/<hash>`` and every host links to it. Store files are
    read-only so that a test or tool writing into one host cannot silently change others.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._written: set[str] = set()

    @staticmethod
    def digest(files: dict[str, bytes | None], executable: bool = False) -> str:
        h = hashlib.sha256(b"x" if executable else b"-")
        for rel in sorted(files):
            data = files[rel]
            h.update(rel.encode() + b"\0")
            h.update(b"d" if data is None else b"f" + len(data).to_bytes(8, "big") + data)
        return h.hexdigest()[:32]

    def put(self, files: dict[str, bytes | None], executable: bool = False) -> Path:
        """Write a tree once; ``None`` values are (empty) directories."""
        key = self.digest(files, executable)
        target = self.root / key
        if key in self._written:
            return target
        made: set[str] = set()
        target.mkdir(parents=True, exist_ok=True)
        mode = 0o555 if executable else 0o444
        for rel in sorted(files):
            data = files[rel]
            path = target / rel
            if data is None:
                path.mkdir(parents=True, exist_ok=True)
                continue
            parent = os.path.dirname(rel)
            if parent and parent not in made:
                path.parent.mkdir(parents=True, exist_ok=True)
                made.add(parent)
            with open(path, "wb") as fh:
                fh.write(data)
            os.chmod(path, mode)
        self._written.add(key)
        return target

    def link(self, target: Path, link: Path, up: int) -> None:
        """Link ``link`` to a store tree; ``up`` is how many levels ``link``'s directory is below
        the store's parent. Relative links keep a generated lab movable as a whole."""
        os.symlink("../" * up + f"{self.root.name}/{target.name}", link, target_is_directory=True)
