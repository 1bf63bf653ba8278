"""A disk that fills mid-write, for the tests of every writer: fsync answers ENOSPC."""

from __future__ import annotations

import errno
import os

import pytest


def disk_full_on(monkeypatch: pytest.MonkeyPatch, marker: str) -> None:
    """fsync of a file whose path holds ``marker`` fails with ENOSPC; every other fsync works."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if marker in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
