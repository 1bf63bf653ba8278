"""k3fleet.evidence.writer: the one writer's destination rules and failure modes, as tables.

The failures a test cannot cause for real on a shared machine (a full disk, a read-only
filesystem) are injected at the system call; the file they would have replaced is compared
byte for byte, and no temporary file may be left.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from k3fleet.errors import IncompleteError, UsageError
from k3fleet.evidence import RunDir
from k3fleet.evidence.writer import DestinationExists, atomic_replace, check_output, write_output


def _temps(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


def _link(t: Path) -> Path:
    (t / "target").write_text("kept")
    (t / "link").symlink_to(t / "target")
    return t / "link"


def _dangling(t: Path) -> Path:
    (t / "dangling").symlink_to(t / "nowhere")
    return t / "dangling"


def _fifo(t: Path) -> Path:
    os.mkfifo(t / "fifo")
    return t / "fifo"


def _socket(t: Path) -> Path:
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(t / "sock"))
    s.close()
    return t / "sock"


def _existing(t: Path) -> Path:
    (t / "old").write_text("old bytes")
    return t / "old"


REFUSED: list[tuple[str, Callable[[Path], Path], bool, str]] = [
    ("symlink", _link, True, "is a symbolic link (k3fleet does not write through links: give the real path)"),
    ("dangling symlink", _dangling, True, "is a symbolic link"),
    ("fifo", _fifo, True, "is a FIFO: give a regular file name"),
    ("socket", _socket, True, "is a socket: give a regular file name"),
    ("directory", lambda t: t, True, "is a directory: give a file name"),
    ("existing file", _existing, False, "exists: pass --force to replace it"),
    ("missing parent", lambda t: t / "a" / "b", True, "does not exist"),
    ("parent is a file", lambda t: _existing(t) / "x", True, "is not a directory"),
    ("/proc", lambda _t: Path("/proc/self/comm"), True, "is under /proc, a kernel filesystem"),
    ("/sys", lambda _t: Path("/sys/k3fleet-test"), True, "is under /sys, a kernel filesystem"),
]


@pytest.mark.parametrize(("case", "make", "force", "problem"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_destinations(tmp_path: Path, case: str, make: Callable[[Path], Path], force: bool,
                              problem: str) -> None:
    dest = make(tmp_path)
    before = os.lstat(dest) if os.path.lexists(dest) else None
    with pytest.raises(UsageError) as err:
        write_output(dest, b"new", "--out", force=force)
    assert problem in str(err.value) and str(err.value).startswith(f"--out {dest}") and "\n" not in str(err.value)
    if before is not None:
        after = os.lstat(dest)
        assert (after.st_mode, after.st_ino, after.st_size) == (before.st_mode, before.st_ino, before.st_size)
    assert _temps(tmp_path) == []
    if case == "symlink":
        assert (tmp_path / "target").read_text() == "kept"


def test_character_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="/dev/null is a character device"):
        write_output(Path("/dev/null"), b"x", "--out", force=True)
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(tmp_path / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    with pytest.raises(UsageError, match="is a character device"):
        write_output(tmp_path / "null", b"x", "--out", force=True)
    assert stat.S_ISCHR(os.lstat(tmp_path / "null").st_mode)


def test_inside_an_input_run_is_refused_through_links_too(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.md").write_text("the run's own")
    (tmp_path / "alias").symlink_to(run)
    for dest in (run / "report.md", run / "new.md", tmp_path / "alias" / "new.md", run):
        with pytest.raises(UsageError, match="a run directory this command reads"):
            check_output(dest, "--out", force=True, inputs=[run])
    assert (run / "report.md").read_text() == "the run's own" and sorted(p.name for p in run.iterdir()) == [
        "report.md"]
    check_output(tmp_path / "run.md", "--out", inputs=[run])  # a sibling named like the run is fine


def test_new_file_and_forced_replace(tmp_path: Path) -> None:
    dest = tmp_path / "out.prom"
    write_output(dest, b"one\n", "--out")
    assert dest.read_bytes() == b"one\n" and oct(dest.stat().st_mode & 0o777) == "0o644"
    write_output(dest, lambda fh: fh.write(b"two\n"), "--out", force=True)
    assert dest.read_bytes() == b"two\n" and _temps(tmp_path) == []


def _failing(call: str, code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    real = getattr(os, call)

    def fail(*args: object, **kw: object) -> object:
        if call != "fsync" or ".tmp" in os.readlink(f"/proc/self/fd/{args[0]}"):
            raise OSError(code, os.strerror(code))
        return real(*args, **kw)

    monkeypatch.setattr(os, call, fail)


FAILURES = [("fsync", errno.ENOSPC, IncompleteError, "No space left on device: the disk filled mid-write"),
            ("fsync", errno.EDQUOT, IncompleteError, "the disk filled mid-write"),
            ("replace", errno.EROFS, UsageError, "Read-only file system"),
            ("link", errno.EACCES, UsageError, "Permission denied")]


@pytest.mark.parametrize(("call", "code", "exc", "text"), FAILURES, ids=[f"{c[0]}-{errno.errorcode[c[1]]}"
                                                                         for c in FAILURES])
def test_failures_leave_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str,
                                                  code: int, exc: type[Exception], text: str) -> None:
    dest = _existing(tmp_path) if call != "link" else tmp_path / "new"
    _failing(call, code, monkeypatch)
    with pytest.raises(exc) as err:
        write_output(dest, b"new bytes", "--archive", force=call != "link")
    assert str(err.value).startswith(f"cannot write --archive {dest}: ") and text in str(err.value)
    if call != "link":
        assert dest.read_text() == "old bytes"
    else:
        assert not dest.exists()
    assert _temps(tmp_path) == []


def test_a_file_that_appears_while_writing_is_never_replaced(tmp_path: Path) -> None:
    dest = tmp_path / "race"

    def fill(fh: IO[bytes]) -> None:
        dest.write_text("someone else's")  # created between the check and the rename
        fh.write(b"ours")

    with pytest.raises(DestinationExists, match="appeared while it was written: pass --force"):
        write_output(dest, fill, "--out")
    assert dest.read_text() == "someone else's" and _temps(tmp_path) == []


def test_the_run_directory_shares_the_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rd = RunDir.create(tmp_path, "audit", ["k3fleet", "audit"], out=tmp_path / "run")
    rd.write_text("report.md", "first\n")
    _failing("fsync", errno.ENOSPC, monkeypatch)
    with pytest.raises(IncompleteError, match="No space left on device; the run directory is incomplete"):
        rd.write_text("report.md", "second\n")
    assert (tmp_path / "run" / "report.md").read_text() == "first\n" and _temps(tmp_path / "run") == []


def test_atomic_replace_without_replace_links_into_place(tmp_path: Path) -> None:
    dest = tmp_path / "once"
    atomic_replace(dest, b"1", error=lambda e: UsageError(str(e)), replace=False)
    with pytest.raises(UsageError, match="taken"):
        atomic_replace(dest, b"2", error=lambda e: UsageError(str(e)), replace=False,
                       exists=lambda: UsageError("taken"))
    assert dest.read_bytes() == b"1" and os.stat(dest).st_nlink == 1 and _temps(tmp_path) == []


def test_run_dir_out_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UsageError, match="is a symbolic link: give the real directory"):
        RunDir.create(tmp_path, "audit", ["k3fleet"], out=tmp_path / "link")
    assert list((tmp_path / "real").iterdir()) == []


def test_dash_writes_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    write_output(Path("-"), b"to stdout\n", "--out")
    assert capfd.readouterr().out == "to stdout\n"
