"""The one writer of files: the run directory's files and every file k3fleet writes outside one.

The core, ``atomic_replace``, writes a unique temporary file in the destination's directory,
fsyncs it, renames it into place and fsyncs the directory; whatever fails, the temporary file is
removed and the old file (if any) is untouched. ``RunDir`` writes every evidence file through it.

Files written outside a run directory (``report --out``, ``decide --archive``) go through
``write_output``, which first refuses a bad destination with one line (docs/safety.md "Writes"):

- only a regular file or a new name: never a symlink (the link itself is judged, with lstat, so
  ``/dev/stdout`` is refused, not followed), a directory, a device, a FIFO or a socket;
- an existing file only with ``--force``; without it the new file is linked into place, which
  fails if a file appeared meanwhile, so nothing is ever replaced by accident;
- never inside a run directory the command reads (both paths resolved), nor under /proc or /sys;
- ``-`` writes to stdout instead.

Exit codes: a refused or unusable destination (EROFS, EACCES, a missing directory) is 2; a disk
that fills mid-write (ENOSPC, EDQUOT, EFBIG) is 3, since the output is then incomplete.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from k3fleet.bounds import file_type
from k3fleet.errors import IncompleteError, UsageError

STDOUT = "-"
# Evidence (run-directory files, the evidence package) can hold prompts, tool arguments and answers:
# its owner only (docs/safety.md "Evidence privacy"). A report the user names is redacted and holds no
# bodies; it stays readable by others, as a node_exporter textfile collector running as its own user needs.
FILE_MODE = 0o600
OUTPUT_MODE = 0o644
# Errors that mean the disk (or the quota) filled while writing: the output is incomplete (exit 3).
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# Filesystems that cannot hard-link (some FUSE and network mounts) answer with one of these.
_NO_LINK = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV, errno.ENOSYS})
# Kernel pseudo-filesystems: nothing k3fleet writes belongs there.
_PSEUDO = ("/proc", "/sys")

Fill = Callable[[IO[bytes]], None]


class DestinationExists(UsageError):
    """The destination appeared while the file was written, and replacing was not asked for."""


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename itself is still atomic
    finally:
        os.close(fd)


def _fill_bytes(data: bytes) -> Fill:
    def fill(fh: IO[bytes]) -> None:
        fh.write(data)

    return fill


def atomic_replace(path: Path, content: bytes | Fill, *, error: Callable[[OSError], Exception],
                   replace: bool = True, exists: Callable[[], Exception] | None = None,
                   mode: int = FILE_MODE, durable: bool = True) -> None:
    """Write ``content`` (bytes, or a function writing into the file) to ``path`` atomically.

    ``replace=False`` never replaces an existing name: the file is hard-linked into place, which
    fails if one appeared (``exists()`` is raised). An OSError becomes ``error(exc)``; any failure
    removes the temporary file. ``durable=False`` leaves out the two fsyncs: for many files written
    in a row that the caller syncs at once afterwards (``RunDir.write_manifest`` does, before the
    manifest; an fsync costs milliseconds, 100,000 of them minutes).
    """
    fill = _fill_bytes(content) if isinstance(content, bytes) else content
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise error(exc) from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if replace:
            os.replace(tmp, path)
        else:
            _link_into_place(tmp, path, exists)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise error(exc) from exc
        raise
    if durable:
        fsync_dir(path.parent)


def _link_into_place(tmp: str, path: Path, exists: Callable[[], Exception] | None) -> None:
    def taken() -> Exception:
        return exists() if exists is not None else FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))

    try:
        os.link(tmp, path)
    except FileExistsError:
        raise taken() from None
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        # No hard links here: check, then rename (a narrower window, the best this filesystem allows).
        if os.path.lexists(path):
            raise taken() from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


# -- files outside a run directory ----------------------------------------------------------------


def is_stdout(path: Path | str | None) -> bool:
    return path is not None and str(path) == STDOUT


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link (k3fleet does not write through links: give the real path)"
    return f"{file_type(mode)}: give {'a file name' if stat.S_ISDIR(mode) else 'a regular file name'}"


def _inside(path: str, base: str) -> bool:
    return path == base or os.path.commonpath([base, path]) == base


def check_output(path: Path, flag: str, *, force: bool = False, inputs: Sequence[Path] = ()) -> None:
    """Refuse ``path`` as an output file (one UsageError line) unless it is a new name or, with
    ``force``, a regular file, in an existing directory outside every run in ``inputs``."""
    where = f"{flag} {path}"
    if not str(path) or str(path).endswith("/"):
        raise UsageError(f"{where} is a directory: give a file name")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise UsageError(f"{where}: {Path(path).parent} is not a directory") from None
    except OSError as exc:
        raise UsageError(f"{where}: {exc.strerror or exc}") from exc
    parent = Path(os.path.abspath(path)).parent
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        raise UsageError(f"{where}: directory {parent} does not exist") from None
    except OSError as exc:
        raise UsageError(f"{where}: {parent}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(pst.st_mode):
        raise UsageError(f"{where}: {parent} is not a directory")
    real_parent = os.path.realpath(parent)
    for pseudo in _PSEUDO:
        if _inside(real_parent, pseudo):
            raise UsageError(f"{where} is under {pseudo}, a kernel filesystem: write the file elsewhere")
    real = os.path.join(real_parent, Path(path).name)
    for run in inputs:
        base = os.path.realpath(run)
        if _inside(real, base):
            raise UsageError(f"{where} is inside {run}, a run directory this command reads: write it elsewhere")
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{where} is {_kind(st.st_mode)}")
        if not force:
            raise UsageError(f"{where} exists: pass --force to replace it")


def _output_error(path: Path, flag: str) -> Callable[[OSError], Exception]:
    def error(exc: OSError) -> Exception:
        why = exc.strerror or str(exc)
        if exc.errno in _FULL:
            return IncompleteError(f"cannot write {flag} {path}: {why}: the disk filled mid-write; nothing was "
                                   "replaced")
        return UsageError(f"cannot write {flag} {path}: {why}")

    return error


def write_output(path: Path, content: bytes | Fill, flag: str, *, force: bool = False,
                 inputs: Sequence[Path] = (), mode: int = OUTPUT_MODE) -> None:
    """Write an output file the user named (``-``: stdout) by the rules above."""
    if is_stdout(path):
        _write_stdout(content, flag)
        return
    path = Path(path)
    check_output(path, flag, force=force, inputs=inputs)

    def appeared() -> Exception:
        return DestinationExists(f"{flag} {path} appeared while it was written: pass --force to replace it")

    atomic_replace(path, content, error=_output_error(path, flag), replace=force, exists=appeared, mode=mode)


def _write_stdout(content: bytes | Fill, flag: str) -> None:
    out = sys.stdout.buffer
    try:
        sys.stdout.flush()
        if isinstance(content, bytes):
            out.write(content)
        else:
            content(out)
        out.flush()
    except BrokenPipeError:
        # The reader went away (`| head`): not an error of ours; keep Python from complaining at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:
        raise _output_error(Path(STDOUT), flag)(exc) from exc


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB chunks (the manifest's and the package's digests)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
