"""The run directory: every run leaves evidence, and every byte of it passes the redactor.

A run directory holds the command, inputs, events, per-host facts, findings, verdict, journal
and rendered reports, with a sha256 manifest written last (docs/safety.md). Writing rules:

- created exclusively: ``command.json`` is claimed with O_EXCL, so two runs on one ``--out``
  cannot interleave (the second is refused);
- every file is written to a unique temporary file in the same directory, fsync'd, renamed over
  its name, and the directory is fsync'd: a crash leaves the old file or the new one, never half;
- nothing is written outside the directory: host names become file names by percent-encoding
  (``k3fleet.evidence.layout.host_file_name``), and a path that would leave the directory is refused.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import getpass
import json
import os
import re
import secrets
import socket
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from k3fleet import __version__
from k3fleet.bounds import InputTooLarge, cap_bytes, check_path_name, read_input
from k3fleet.errors import IncompleteError, UsageError
from k3fleet.evidence.layout import COMMAND, MANIFEST, host_file
from k3fleet.evidence.redact import (
    REDACTED,
    STREAM_CHUNK,
    is_secret_name,
    redact,
    redact_argv,
    redact_file_text,
    redact_pieces,
    redact_text,
)
from k3fleet.evidence.verify import verify_run
from k3fleet.evidence.writer import Fill, atomic_replace, sha256_file

# Controller environment worth keeping as evidence (values still pass the redactor).
_ENV_PREFIXES = ("K3FLEET_", "ANSIBLE_", "NCCL_", "VLLM_")
# Run directories hold request bodies and prompts: their owner's only (docs/safety.md "Evidence privacy").
_FILE_MODE = 0o600
_DIR_MODE = 0o700


class EvidenceWriteError(IncompleteError):
    """A file of the run directory could not be written (full disk, permissions): evidence is incomplete."""


def _utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def new_run_id(kind: str) -> str:
    return f"{_utcnow().strftime('%Y%m%dT%H%M%SZ')}-{kind}-{secrets.token_hex(3)}"


def _write_error(path: Path, exc: OSError) -> EvidenceWriteError:
    return EvidenceWriteError(f"cannot write {path}: {exc.strerror or exc}; the run directory is incomplete")


def atomic_write(path: Path, data: bytes, *, durable: bool = True, dir_fd: int | None = None) -> None:
    """Write ``data`` to ``path`` through a unique temp file in the same directory, fsync'd, renamed
    (the one writer's core, ``k3fleet.evidence.writer.atomic_replace``); a failure is exit 3."""
    atomic_replace(path, data, error=lambda exc: _write_error(path, exc), durable=durable, dir_fd=dir_fd)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _dumps(data: Any, **kw: Any) -> str:
    return json.dumps(redact(data), default=str, ensure_ascii=False, **kw)


class JsonEntries:
    """A large JSON object given as (key, value) pairs made one at a time (a verdict's hosts): inside
    ``RunDir.write_json``'s data it is written entry by entry, never held whole. Each entry passes the
    redactor as ``{key: value}``, which redacts it as it would inside the whole object (a mapping's
    entries are redacted one by one; only string-valued name/value pairs are judged together, and
    these entries' values are objects). Read once."""

    def __init__(self, items: Iterable[tuple[str, Any]]) -> None:
        self._items = items

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self._items)


_INDENT = "  "
# Bytes written to the file at a time: a large document never exists as one string.
_CHUNK = 1 << 16


_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False, indent=2)


def _json_chunks(obj: Any, pad: str = "") -> Iterator[str]:
    """``obj`` (already redacted, but for its JsonEntries) as ``json.dumps(obj, indent=2)`` would write it."""
    if isinstance(obj, JsonEntries):
        inner = pad + _INDENT
        sep = "{"
        for key, value in obj:
            for k, v in redact({key: value}).items():
                yield f"{sep}\n{inner}{json.dumps(k, ensure_ascii=False)}: "
                # One entry (a host's verdict) is encoded at once; JSON strings hold no raw newline, so
                # every newline starts a line of the structure and takes the entry's indent.
                yield _ENCODER.encode(v).replace("\n", "\n" + inner)
                sep = ","
        yield "{}" if sep == "{" else f"\n{pad}}}"
    elif isinstance(obj, dict) and _holds_entries(obj):
        inner = pad + _INDENT
        sep = "{"
        for k, v in obj.items():
            yield f"{sep}\n{inner}{json.dumps(k, ensure_ascii=False)}: "
            yield from _json_chunks(v, inner)
            sep = ","
        yield "{}" if sep == "{" else f"\n{pad}}}"
    elif not pad:
        yield from _ENCODER.iterencode(obj)
    else:
        # JSON strings hold no raw newline: every newline the encoder yields starts a line of the structure.
        nl = "\n" + pad
        for chunk in _ENCODER.iterencode(obj):
            yield chunk.replace("\n", nl) if "\n" in chunk else chunk


def _holds_entries(obj: Any) -> bool:
    if isinstance(obj, JsonEntries):
        return True
    if isinstance(obj, dict):
        return any(_holds_entries(v) for v in obj.values())
    return False


def _json_fill(data: Any, *, redacted: bool = False) -> Fill:
    """Write ``data`` through the redactor as indented JSON and a newline, chunk by chunk
    (``redacted``: the caller has passed it through the redactor already)."""
    def fill(fh: IO[bytes]) -> None:
        out = data if redacted else redact(data)
        if not _holds_entries(out):
            # A document without JsonEntries is one file's worth (a host's facts): encoded at once.
            fh.write((_ENCODER.encode(out) + "\n").encode("utf-8"))
            return
        buf: list[str] = []
        size = 0
        for chunk in _json_chunks(out):
            buf.append(chunk)
            size += len(chunk)
            if size >= _CHUNK:
                fh.write("".join(buf).encode("utf-8"))
                buf, size = [], 0
        buf.append("\n")
        fh.write("".join(buf).encode("utf-8"))
    return fill


# The layout write_json puts between JSON tokens: a newline and the indent after it. JSON text holds no
# raw newline inside a string (a strict parser refuses one), so every match is layout, never content.
_LAYOUT = re.compile(rb"\n *")


def _reads_as(raw: bytes, data: Any) -> bool:
    """Whether ``raw`` is ``data`` token for token with nothing but newlines and indents between the
    tokens (as write_json lays JSON out): then the file says exactly what ``data`` says, no key twice,
    nothing the parse dropped. ``raw`` must be the text ``data`` was parsed from."""
    try:
        compact = json.dumps(data, ensure_ascii=False, separators=(",", ": ")).encode("utf-8")
    except (TypeError, ValueError):
        return False
    return _LAYOUT.sub(b"", raw) == compact


# Run directories this process claimed, and whether it made the directory itself (an --out that
# existed empty is emptied again, never removed).
_CLAIMED: list[tuple[Path, bool]] = []


# Run directories this process writes (created or opened): the only runs another run may be nested in
# (a change night's gating audit), docs/safety.md "Writes".
_HOSTS: set[str] = set()


def forget_claims() -> None:
    """Start a new command: claims made before it are not its to discard."""
    _CLAIMED.clear()
    _HOSTS.clear()


def host_run(path: Path) -> Path | None:
    """The run directory ``path`` would be inside (its nearest ancestor holding command.json), if any."""
    real = Path(os.path.realpath(path))
    for folder in real.parents:
        if (folder / COMMAND).is_file():
            return folder
    return None


def _refuse_nested(path: Path, where: str) -> None:
    host = host_run(path)
    if host is not None and str(host) not in _HOSTS:
        raise UsageError(f"{where} is inside the run directory {host}: a run directory is never made inside "
                         "another (it would change that run under its manifest); choose another --out")


def discard_unstarted() -> list[Path]:
    """Remove the claims of this process's run directories that hold nothing but command.json.

    The CLI calls this when a command ends in a usage error: a run that never started leaves no
    directory that ``verify`` or ``merge`` would later call interrupted (docs/architecture.md
    "Contracts": a usage error writes nothing). A run that wrote any evidence is kept.
    """
    removed = []
    while _CLAIMED:
        path, made = _CLAIMED.pop()
        try:
            if [p.name for p in path.iterdir()] != [COMMAND]:
                continue
            (path / COMMAND).unlink()
            if made:
                path.rmdir()
            removed.append(path)
        except OSError:
            continue
    return removed


class RunDir:
    """One run's evidence directory. Files are written through it so the redactor and the manifest see them all."""

    def __init__(self, path: Path, fd: int | None = None) -> None:
        self.path = path
        # Files written without their own fsync (write_json durable=False): synced before the manifest.
        self._unsynced = False
        # The run directory opened once (O_DIRECTORY | O_NOFOLLOW) when it is claimed: every file is written
        # relative to it, so a link swapped in for the path after the claim is never written through.
        self._fd = fd

    def __del__(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    def _dir_fd(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, _DIR_FLAGS)
            except OSError as exc:
                raise _write_error(self.path, exc) from exc
        return self._fd

    def check_claim(self) -> None:
        """The path still names the directory this run claimed (not a link or another directory swapped in
        since): checked before the path itself is used again, e.g. to package the run."""
        try:
            here = os.stat(self.path, follow_symlinks=False)
            mine = os.fstat(self._dir_fd())
        except OSError as exc:
            raise IncompleteError(f"run directory {self.path} is gone ({exc.strerror or exc})") from exc
        if (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino):
            raise IncompleteError(f"run directory {self.path} was replaced after it was claimed (a link or another "
                                  "directory stands there now): nothing is written or read through it")

    def _at(self, rel: str) -> tuple[int, str]:
        """(descriptor of ``rel``'s folder, its name): each folder opened or made relative to the claimed
        directory, never through a link; the caller closes the descriptor."""
        parts = self._checked(rel).parts
        fd = os.dup(self._dir_fd())
        try:
            for part in parts[:-1]:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, _DIR_MODE, dir_fd=fd)
                if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    os.close(fd)
                    raise UsageError(f"refusing to write {rel!r}: a link inside {self.path} leads out of it")
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except OSError as exc:
            os.close(fd)
            raise _write_error(self.path / rel, exc) from exc
        return fd, parts[-1]

    def _replace(self, rel: str, content: bytes | Fill, *, durable: bool = True) -> Path:
        p = self.path / self._checked(rel)
        fd, _ = self._at(rel)
        try:
            atomic_replace(p, content, error=lambda exc: _write_error(p, exc), durable=durable, dir_fd=fd)
        finally:
            os.close(fd)
        return p

    # -- creating and opening ------------------------------------------------------------------

    @classmethod
    def create(cls, base: Path, kind: str, argv: Sequence[str], *, out: Path | None = None,
               record: Mapping[str, Any] | None = None) -> RunDir:
        """Create and claim a new run directory (``out``, or a fresh ``base/<id>``).

        ``record`` adds fields to command.json (choices the run was started with).
        Refused with a one-line UsageError when ``out`` is a file, is not empty, or is claimed by
        another run at the same moment.
        """
        path = Path(out) if out is not None else Path(base) / new_run_id(kind)
        where = f"--out {path}" if out is not None else f"run directory {path}"
        check_path_name(path, "--out" if out is not None else "--runs-dir")
        if path.is_symlink():
            raise UsageError(f"{where} is a symbolic link: give the real directory")
        if path.exists() and not path.is_dir():
            raise UsageError(f"{where} exists and is not a directory: choose another --out")
        _refuse_nested(path, where)
        made = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create {where}: {path.parent}: {exc.strerror or exc}") from exc
        try:
            path.mkdir(mode=_DIR_MODE)
            made = True
        except FileExistsError:
            if not path.is_dir():
                raise UsageError(f"{where} exists and is not a directory: choose another --out") from None
            if any(path.iterdir()):
                raise UsageError(f"{where} exists and is not empty: choose another --out") from None
        except OSError as exc:
            raise UsageError(f"cannot create {where}: {exc.strerror or exc}") from exc
        try:
            dir_fd = os.open(path, _DIR_FLAGS)
        except OSError as exc:
            if made:
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise UsageError(f"cannot create {where}: {exc.strerror or exc} (a link is never a run directory)") from exc
        rd = cls(path, dir_fd)
        try:
            # An empty --out the user made keeps its own mode otherwise: the owner's only.
            os.fchmod(dir_fd, _DIR_MODE)
            fd = os.open(COMMAND, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, _FILE_MODE, dir_fd=dir_fd)
        except FileExistsError:
            raise UsageError(f"{where} is being written by another k3fleet run: choose another --out") from None
        except OSError as exc:
            raise UsageError(f"cannot create {where}: {exc.strerror or exc}") from exc
        command = {
            "kind": kind,
            "argv": redact_argv(list(argv)),
            "cwd": str(Path.cwd()),
            "k3fleet_version": __version__,
            "user": _user(),
            "controller": socket.gethostname(),
            "started_at": _utcnow().isoformat(timespec="seconds"),
            "env": {k: (REDACTED if is_secret_name(k) else v) for k, v in sorted(os.environ.items())
                    if k.startswith(_ENV_PREFIXES)},
            **dict(record or {}),
        }
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(_dumps(command, indent=2) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.fsync(dir_fd)
        except OSError as exc:
            # Leave nothing behind: a half-written claim would block the next run on this --out.
            with contextlib.suppress(OSError):
                (path / COMMAND).unlink()
            if made:
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise UsageError(f"cannot create {where}: {exc.strerror or exc}") from exc
        _CLAIMED.append((rd.path, made))
        _HOSTS.add(os.path.realpath(rd.path))
        return rd

    @classmethod
    def open(cls, path: Path) -> RunDir:
        path = Path(path)
        if not path.is_dir():
            raise UsageError(f"{path} is not a directory: give a k3fleet run directory")
        if not (path / COMMAND).is_file():
            raise UsageError(f"{path} is not a k3fleet run directory (no {COMMAND})")
        _HOSTS.add(os.path.realpath(path))
        return cls(path)

    # -- paths ------------------------------------------------------------------------------------

    def _checked(self, rel: str) -> Path:
        parts = Path(rel).parts
        if not rel or Path(rel).is_absolute() or ".." in parts:
            raise UsageError(f"refusing to write {rel!r}: it would leave the run directory {self.path}")
        return Path(rel)

    def file(self, rel: str) -> Path:
        """The path of ``rel`` inside the run directory (parents created); never outside it."""
        p = self.path / self._checked(rel)
        try:
            p.parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise _write_error(p, exc) from exc
        base = os.path.realpath(self.path)
        if os.path.commonpath([base, os.path.realpath(p.parent)]) != base:
            raise UsageError(f"refusing to write {rel!r}: a link inside {self.path} leads out of it")
        return p

    @staticmethod
    def host_file(folder: str, host: str, suffix: str = ".json") -> str:
        """``folder/<encoded host><suffix>``: where a per-host file goes (``layout.host_file``)."""
        return host_file(folder, host, suffix)

    # -- writing ----------------------------------------------------------------------------------

    def write_json(self, rel: str, data: Any, *, durable: bool = True, read_as: bytes | None = None) -> Path:
        """``data`` as JSON through the redactor, written in chunks; a :class:`JsonEntries` inside it is
        written entry by entry. ``durable=False`` for one of many files in a row (a merge's facts): it is
        not fsync'd on its own, the manifest syncs them all at once first.

        ``read_as``: the JSON text ``data`` was parsed from (a merge's facts, read from a slice). When the
        redactor leaves ``data`` as it is and the text is ``data`` token for token in this layout, the text
        is written as read instead of encoded again (docs/scale.md "Merging 100,000 hosts"); otherwise
        the redacted data is written as always."""
        content: bytes | Fill
        if read_as is None:
            content = _json_fill(data)
        else:
            redacted = redact(data)
            content = (read_as if redacted == data and _reads_as(read_as, data)
                       else _json_fill(redacted, redacted=True))
        p = self._replace(rel, content, durable=durable)
        self._unsynced = self._unsynced or not durable
        return p

    def note_unsynced(self) -> None:
        """Files were written into this run directory without their own fsync by another process (a
        merge's writers, forked from this one): the manifest syncs them first, as its own."""
        self._unsynced = True

    def write_text(self, rel: str, text: str) -> Path:
        """``text`` through the redactor; a long one (a log) redacted and written a piece at a time."""
        if len(text) <= STREAM_CHUNK:
            return self._replace(rel, redact_text(text).encode("utf-8"))

        def fill(fh: IO[bytes]) -> None:
            for piece in redact_pieces(text):
                fh.write(piece.encode("utf-8"))

        return self._replace(rel, fill)

    def write_jsonl(self, rel: str, rows: Iterable[Mapping[str, Any]]) -> Path:
        return self._replace(rel, "".join(_dumps(row) + "\n" for row in rows).encode("utf-8"))

    def append_jsonl(self, rel: str, row: Mapping[str, Any]) -> None:
        """Append one line and fsync it: a journal must survive a killed controller.

        A torn last line (power loss mid-write) is terminated first, so this line starts on a
        line boundary and is never merged into it.
        """
        p = self.path / self._checked(rel)
        line = (_dumps(row) + "\n").encode("utf-8")
        folder, name = self._at(rel)
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(name, flags, _FILE_MODE, dir_fd=folder), "a+b") as fh:
                fh.seek(0, os.SEEK_END)
                if fh.tell() > 0:
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        line = b"\n" + line
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise _write_error(p, exc) from exc
        finally:
            os.close(folder)

    def update_command(self, **fields: Any) -> Path:
        """Add fields to command.json (a choice made after the run started, e.g. host-key checking)."""
        # lazy: the reader imports the models it validates into; a writer needs them only here.
        from k3fleet.evidence.reader import RunReader

        data = RunReader(self.path).object(COMMAND)
        data.update(fields)
        return self.write_json(COMMAND, data)

    def copy_input(self, src: Path, rel: str) -> Path | None:
        """Copy an input file or directory tree, every file through the structural redactor.

        YAML/JSON and INI inventories keep their shape with secret values replaced; vault files
        and binary files are recorded by size and digest only.
        """
        src = Path(src)
        if not src.exists():
            return None
        if src.is_dir():
            folder, _ = self._at(f"{rel}/.keep")
            os.close(folder)
            dest = self.path / self._checked(rel)
            for dirpath, dirnames, filenames in os.walk(src):
                dirnames[:] = sorted(d for d in dirnames if d not in (".git", "__pycache__"))
                for name in sorted(filenames):
                    f = Path(dirpath) / name
                    sub = f.relative_to(src).as_posix()
                    self._copy_file(f, f"{rel}/{sub}")
            return dest
        return self._copy_file(src, rel)

    def copy_inventory(self, inventory: Path, rel: str = "inputs") -> None:
        """The inventory as used: the file or directory, and a file's group_vars/ and host_vars/."""
        inventory = Path(inventory)
        if inventory.is_dir():
            self.copy_input(inventory, f"{rel}/inventory")
            return
        self.copy_input(inventory, f"{rel}/inventory{inventory.suffix}")
        for sub in ("group_vars", "host_vars"):
            self.copy_input(inventory.parent / sub, f"{rel}/{sub}")

    def _copy_file(self, src: Path, rel: str) -> Path | None:
        # The one bounded reader: a device, FIFO or socket among the inputs is recorded, not read.
        limit = cap_bytes("record")
        try:
            raw = read_input(src, "", kind="an input file", max_bytes=limit)
        except InputTooLarge:
            size = src.stat().st_size
            return self.write_text(rel + ".omitted", f"{src.name}: larger than {limit} bytes ({size} bytes), not "
                                                     "copied into evidence\n")
        except UsageError as exc:
            return self.write_text(rel + ".unreadable", f"{exc}\n")
        size = len(raw)
        if b"\0" in raw[:8192]:
            return self.write_text(rel + ".omitted", f"{src.name}: binary ({size} bytes), not copied into evidence\n")
        text = raw.decode("utf-8", errors="replace")
        return self._replace(rel, redact_file_text(src.name, text).encode("utf-8"))

    # -- reading ----------------------------------------------------------------------------------

    # -- manifest ---------------------------------------------------------------------------------

    def write_manifest(self) -> Path:
        """sha256 of every file in the run directory (nested runs included), written last."""
        if self._unsynced:
            # Every file the manifest lists is on disk before the manifest says the run finished.
            os.sync()
            self._unsynced = False
        entries = []
        for p in sorted(self.path.rglob("*")):
            rel = p.relative_to(self.path).as_posix()
            if rel == MANIFEST or p.is_symlink() or not p.is_file():
                continue
            try:
                entries.append({"path": rel, "sha256": sha256_file(p), "bytes": p.stat().st_size})
            except OSError as exc:
                raise EvidenceWriteError(f"cannot read {p} for the manifest: {exc.strerror or exc}") from exc
        return self.write_json(MANIFEST, {"algorithm": "sha256", "files": entries,
                                          "written_at": _utcnow().isoformat(timespec="seconds")})


    def verify(self) -> list[str]:
        """Differences from the manifest as ``path: what`` (empty: intact); see ``verify_run``."""
        return verify_run(self.path).problems

    verify_manifest = verify


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
