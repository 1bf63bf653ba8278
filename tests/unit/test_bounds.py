"""k3fleet.bounds: the caps table, the bounded reader, streamed gzip, and the seconds parser, as tables."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib
from pathlib import Path

import pytest

from k3fleet.bounds import (
    CAPS,
    DURATIONS,
    BoundedGunzip,
    InputTooLarge,
    cap_bytes,
    check_input,
    open_tar,
    parse_bytes,
    parse_seconds,
    read_bounded,
    read_input,
)
from k3fleet.errors import UsageError

# -- the bounded reader --------------------------------------------------------------------------


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def test_refusals_are_one_line_naming_file_kind_and_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K3FLEET_MAX_LOG_BYTES", "100")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.log"
    big.write_bytes(b"x" * 101)
    bomb = tmp_path / "bomb.log.gz"
    bomb.write_bytes(_gz(b"y" * 101))
    damaged = tmp_path / "cut.log.gz"
    damaged.write_bytes(_gz(b"z" * 50)[:-12])
    garbage = tmp_path / "tail.log.gz"
    garbage.write_bytes(_gz(b"ok\n") + b"not gzip")
    cases = [
        ("/dev/zero", "log /dev/zero is a character device, not a text log: give a regular file"),
        (str(fifo), f"log {fifo} is a FIFO, not a text log: give a regular file"),
        (str(big), f"log {big} is 101 bytes: too large for a text log (limit 100 bytes; K3FLEET_MAX_LOG_BYTES "
                   "raises it)"),
        (str(bomb), f"log {bomb}: gzip data with more than 100 bytes decompressed: too large for a text log "
                    "(limit 100 bytes; K3FLEET_MAX_LOG_BYTES raises it)"),
        (str(damaged), f"log {damaged} is damaged gzip data (Compressed file ended before the end-of-stream "
                       "marker was reached), not a text log"),
        (str(garbage), f"log {garbage} is damaged gzip data (trailing garbage after the last gzip member), not a "
                       "text log"),
    ]
    for path, message in cases:
        with pytest.raises(UsageError) as err:
            read_input(Path(path), "log", kind="a text log", limit="log")
        assert str(err.value) == message and "\n" not in str(err.value)


def test_gzip_members_are_read_in_turn_up_to_the_member_cap(tmp_path: Path) -> None:
    f = tmp_path / "rotated.log.gz"
    f.write_bytes(_gz(b"first\n") + _gz(b"second\n") + b"\0" * 512)  # zero padding after the last member
    assert read_input(f, "", kind="a text log", limit="log") == b"first\nsecond\n"
    raw = io.BytesIO(_gz(b"a") * 5)
    stream = BoundedGunzip(raw, max_out=100, too_large=InputTooLarge, max_members=4)
    with pytest.raises(InputTooLarge, match="more than 4 gzip members"):
        stream.read()


def test_gzip_output_is_bounded_per_read_not_per_member() -> None:
    """A megabyte of zeros compresses to about a kilobyte: reading a few bytes must not inflate it all."""
    raw = io.BytesIO(zlib.compress(bytes(1 << 20), wbits=31))
    stream = BoundedGunzip(raw, max_out=1 << 30, too_large=InputTooLarge)
    assert stream.read(10) == bytes(10)
    assert len(stream.read()) == (1 << 20) - 10


def test_only_kinds_that_allow_it_are_decompressed(tmp_path: Path) -> None:
    f = tmp_path / "journal.jsonl"
    f.write_bytes(_gz(b'{"a": 1}\n'))
    assert read_input(f, "journal", kind="a journal", limit="journal") == f.read_bytes()


def test_caps_table_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"log", "capture", "journal", "requests", "record", "run_json", "package", "package_member", "models",
            "metrics", "completion"} <= set(CAPS)
    assert all(c.default > 0 and c.env == f"K3FLEET_MAX_{c.kind.upper()}_BYTES" for c in CAPS.values())
    for text, value in (("1048576", 1 << 20), ("512K", 512 << 10), ("64M", 64 << 20), ("2g", 2 << 30),
                        ("64MiB", 64 << 20)):
        assert parse_bytes(text, "X") == value
    for bad in ("", "-1", "0", "1.5M", "lots", "12Q"):
        with pytest.raises(UsageError):
            parse_bytes(bad, "X")
    monkeypatch.setenv("K3FLEET_MAX_METRICS_BYTES", "1K")
    assert cap_bytes("metrics") == 1024


def test_check_input_refuses_without_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K3FLEET_MAX_LOG_BYTES", "10")
    big = tmp_path / "big.log"
    big.write_bytes(b"x" * 11)
    with pytest.raises(InputTooLarge, match=r"--log .*big.log is 11 bytes: too large for a text log"):
        check_input(big, "--log", kind="a text log", limit="log")
    with pytest.raises(UsageError, match="does not exist"):
        check_input(tmp_path / "none", "--log", kind="a text log", limit="log")


def test_read_bounded_raises_oserrors_callers_already_word(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "decision.json"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="a FIFO, not a regular file"):
        read_bounded(fifo, "run_json")
    with pytest.raises(IsADirectoryError):
        read_bounded(tmp_path, "run_json")
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "missing.json", "run_json")
    monkeypatch.setenv("K3FLEET_MAX_RUN_JSON_BYTES", "4")
    big = tmp_path / "big.json"
    big.write_text("[1, 2]")
    with pytest.raises(OSError, match=r"6 bytes, above the limit \(limit 4 bytes; K3FLEET_MAX_RUN_JSON_BYTES"):
        read_bounded(big, "run_json")
    big.write_text("[1]")
    assert read_bounded(big, "run_json") == b"[1]"


def _tar_gz(path: Path, members: dict[str, bytes]) -> Path:
    with gzip.GzipFile(path, "wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_open_tar_caps_members_and_the_whole_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = _tar_gz(tmp_path / "p.tar.gz", {"d/a": b"a" * 100, "d/b": b"b" * 100})
    with open_tar(archive) as tar:
        names = []
        for member in tar:
            fh = tar.extractfile(member)
            assert fh is not None and fh.read() == member.name[-1].encode() * 100
            names.append(member.name)
    assert names == ["d/a", "d/b"]
    monkeypatch.setenv("K3FLEET_MAX_PACKAGE_MEMBER_BYTES", "99")
    with pytest.raises(InputTooLarge, match=r"member d/a is 100 bytes decompressed: too large for an evidence "), \
            open_tar(archive) as tar:
        list(tar)
    monkeypatch.setenv("K3FLEET_MAX_PACKAGE_MEMBER_BYTES", "100")
    monkeypatch.setenv("K3FLEET_MAX_PACKAGE_BYTES", "1K")
    with pytest.raises(InputTooLarge, match="more than 1024 bytes decompressed"), open_tar(archive) as tar:
        for member in tar:
            fh = tar.extractfile(member)
            assert fh is not None
            fh.read()
    os.mkfifo(tmp_path / "fifo.tar.gz")
    with pytest.raises(UsageError, match="is a FIFO, not an evidence package"), open_tar(tmp_path / "fifo.tar.gz"):
        pass


# -- durations -------------------------------------------------------------------------------------

GOOD = [("90", "watch --for", 90.0), ("90s", "watch --for", 90.0), ("15m", "watch --for", 900.0),
        ("2h", "watch --for", 7200.0), ("7d", "watch --for", 604800.0), ("0.5m", "watch --for", 30.0),
        ("0.1", "watch --interval", 0.1), ("3600", "request --timeout", 3600.0), (5, "audit --host-timeout", 5.0),
        ("0", "--drain-timeout", 0.0), ("0.001", "load slo", 0.001)]

BAD = [("inf", "watch --for", "is not a finite number of seconds"),
       ("-inf", "watch --for", "is not a finite number of seconds"),
       ("nan", "watch --for", "is not a finite number of seconds"),
       ("1e400", "watch --for", "is not a finite number of seconds"),
       ("1e400s", "watch --for", "is not a finite number of seconds"),
       ("Infinity", "watch --for", "is not a finite number of seconds"),
       ("0", "watch --for", "must be at least 1s"),
       ("-5m", "watch --for", "must be at least 1s"),
       ("8d", "watch --for", "is above the maximum of 7d"),
       ("", "watch --for", "give seconds or a number with s, m, h or d (15m)"),
       ("soon", "watch --for", "give seconds or a number with s, m, h or d (15m)"),
       ("0", "load step", "must be positive"),
       ("-1", "--drain-timeout", "must not be negative"),
       ("3601", "request --timeout", "is above the maximum of 1h")]


@pytest.mark.parametrize(("text", "span", "seconds"), GOOD)
def test_good_durations(text: object, span: str, seconds: float) -> None:
    assert parse_seconds(text, "--x", span) == seconds


@pytest.mark.parametrize(("text", "span", "problem"), BAD)
def test_bad_durations_are_one_line(text: str, span: str, problem: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_seconds(text, "--x", span)
    assert str(err.value).startswith(f"--x {text!r}") and str(err.value).endswith(problem)


def test_every_span_is_finite_and_ordered() -> None:
    assert all(0 <= s.low < s.high < float("inf") for s in DURATIONS.values())
    with pytest.raises(UsageError, match="give a number of seconds"):
        parse_seconds("15m", "--timeout", "request --timeout", units=False)
