"""Command replay for lab hosts: one small POSIX sh script answers from recordings.

Every tool a lab host has is ``<root>/bin/<tool>``, the same script. It keys on its full
argument list: the md5 of the tool name and each argument, each followed by a newline,
computed identically by :func:`replay_key`. The recording lives in
``<root>/.replay/<tool>/<key>.out`` (always present, maybe empty), with optional ``.err``,
``.rc`` (exit status when not 0) and ``.sleep`` (seconds, to simulate a slow or hung
command). An argument list without a recording prints
``<tool>: no lab recording for: <args>`` on stderr and exits 2.

The script runs about fifteen times per host per audit, so it stays cheap: one shell, one
md5sum, one cat per stream. It finds the host root from its own path, never from PATH,
which on a lab host is the lab's bin directory alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

REPLAY_DIR = ".replay"
NO_RECORDING_RC = 2

_SCRIPT = """\
#!/bin/sh
# k3fleet lab replay: answers with the recording made for this exact argument list.
t=${0##*/}
case $0 in */*) b=${0%/*} ;; *) b=. ;; esac
case $b in */*) r=${b%/*} ;; *) r=. ;; esac
k=$(printf '%s\\n' "$t" "$@" | @MD5SUM@)
f=$r/.replay/$t/${k%% *}
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


def _system_tool(name: str) -> str:
    # Absolute paths: inside the script PATH is the lab's bin, where these do not exist.
    found = shutil.which(name, path="/usr/bin:/bin")
    if found is None:
        raise LabToolError(f"lab replay needs {name} in /usr/bin or /bin; it was not found")
    return found


def replay_script() -> str:
    return (_SCRIPT.replace("@MD5SUM@", _system_tool("md5sum"))
            .replace("@SLEEP@", _system_tool("sleep"))
            .replace("@CAT@", _system_tool("cat")))


def replay_key(argv: Sequence[str]) -> str:
    """The recording key of a command line, as the replay script computes it."""
    parts = [os.path.basename(str(argv[0])), *(str(a) for a in argv[1:])]
    data = "".join(part + "\n" for part in parts).encode("utf-8")
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def recording_files(argv: Sequence[str], stdout: str, stderr: str = "", rc: int = 0,
                    sleep: float = 0.0) -> dict[str, bytes]:
    """The files (relative to the tool's replay directory) that record one command line."""
    key = replay_key(argv)
    files = {f"{key}.out": stdout.encode("utf-8")}
    if stderr:
        files[f"{key}.err"] = stderr.encode("utf-8")
    if rc:
        files[f"{key}.rc"] = f"{rc}\n".encode()
    if sleep:
        files[f"{key}.sleep"] = f"{sleep:g}\n".encode()
    return files


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
