"""k3fleet.bounds.read_input: every way a named input file fails is one UsageError line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from k3fleet.bounds import read_input
from k3fleet.errors import UsageError


def test_each_failure_is_one_line_naming_the_file(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    big.write_bytes(b"x" * 11)
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x00\x01")
    unreadable = tmp_path / "secret.log"
    unreadable.write_text("x")
    cases = [
        (tmp_path / "missing.log", {}, "log " + str(tmp_path / "missing.log") + " does not exist"),
        (tmp_path, {}, f"log {tmp_path} is a directory, not a text log"),
        (big, {"max_bytes": 10}, f"log {big} is 11 bytes: too large for a text log (limit 10)"),
        (binary, {"text": True}, f"log {binary} is binary, not a text log"),
    ]
    if os.geteuid() != 0:  # root reads a 000 file anyway
        unreadable.chmod(0)
        cases.append((unreadable, {}, f"cannot read log {unreadable}: Permission denied"))
    for path, kw, message in cases:
        with pytest.raises(UsageError) as err:
            read_input(path, "log", kind="a text log", **kw)
        assert str(err.value) == message and "\n" not in str(err.value)


def test_text_and_binary_after_the_probe_window_are_returned(tmp_path: Path) -> None:
    f = tmp_path / "ok.txt"
    f.write_bytes(b"a" * 65536 + b"\x00")
    assert read_input(f, "", kind="a capture", text=True).endswith(b"\x00")
    assert read_input(f, "", kind="a capture", max_bytes=65537) == f.read_bytes()
