"""Bounds on what k3fleet takes in: file sizes, decompressed sizes, HTTP bodies, durations.

Everything the user names or a server sends is bounded here, in one table each
(docs/safety.md "Bounds"):

- ``CAPS``: the most bytes read per kind of input (files and HTTP bodies), each overridable by
  its environment variable (``K3FLEET_MAX_LOG_BYTES=1G``);
- ``read_input``: the one reader for files the user names. It refuses devices, FIFOs and sockets
  before opening (and again on the opened descriptor, so a path swapped for a FIFO cannot hang
  it), reads at most the cap, and decompresses gzip input as a stream under the same cap and a
  member count cap;
- ``open_tar``: a gzip'd tar archive read as a stream under the same caps (evidence packages);
- ``DURATIONS`` and ``parse_seconds``: every seconds option parsed finite and within its range.

Every refusal is one line naming the file (or option), its kind and the limit.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import math
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from k3fleet.errors import UsageError

_MiB = 1 << 20
# Read and decompress in pieces of this size: memory stays near the cap, never a multiple of it.
_CHUNK = 1 << 16
# How far a text input is searched for a NUL byte before it is taken for text.
_BINARY_PROBE = 65536


@dataclass(frozen=True)
class Cap:
    """The most bytes k3fleet takes of one kind of input."""

    kind: str
    what: str  # the inputs this cap covers, for the docs and the messages
    default: int
    gzip: bool = False  # gzip input is decompressed (under the same cap)

    @property
    def env(self) -> str:
        return f"K3FLEET_MAX_{self.kind.upper()}_BYTES"

    def limit(self) -> int:
        """The cap in bytes: the environment variable's value when set, else the default."""
        raw = os.environ.get(self.env)
        if raw is None or not raw.strip():
            return self.default
        return parse_bytes(raw, self.env)


# The one table of input caps. A start-up log can be a whole container log, so it gets the most;
# a /v1/models list or a YAML record is small by nature.
CAPS: dict[str, Cap] = {c.kind: c for c in (
    Cap("log", "vLLM start-up logs and launch commands (accept startup/all --log, --launch-command)", 128 * _MiB,
        gzip=True),
    Cap("capture", "pasted captures (k3fleet triage FILE...)", 64 * _MiB, gzip=True),
    Cap("journal", "a change night's journal.jsonl", 64 * _MiB),
    Cap("requests", "captured request bodies (accept prefix-lint)", 64 * _MiB, gzip=True),
    Cap("record", "YAML records: --owners, --build, --profile, --target, lab profiles, inputs copied into a run "
        "directory", 8 * _MiB),
    Cap("inventory", "an inventory (-i) and each file of its group_vars/ and host_vars/", 64 * _MiB),
    Cap("key", "a signing key (decide --sign-key) and an allowed-signers file", 1 * _MiB),
    Cap("run_json", "one file of a run directory read back (JSON, JSON Lines, the manifest)", 64 * _MiB),
    Cap("package", "an evidence package (.tar.gz), all members decompressed together", 512 * _MiB),
    Cap("package_member", "one member of an evidence package, decompressed", 64 * _MiB),
    Cap("models", "the /v1/models and /version bodies", 8 * _MiB),
    Cap("metrics", "one /metrics page", 16 * _MiB),
    Cap("completion", "one chat completion, streamed or not, and other JSON answers (/tokenize, /health)",
        16 * _MiB),
)}

# Concatenated gzip members (``cat a.gz b.gz``, logrotate) are decompressed in turn, up to this many.
MAX_GZIP_MEMBERS = 1000


class InputTooLarge(UsageError):
    """An input passed its cap: bad input, one line naming it, its kind and the cap."""


def cap_bytes(kind: str) -> int:
    """The cap for ``kind`` (a key of ``CAPS``), honouring its environment variable."""
    return CAPS[kind].limit()


def limit_hint(kind: str) -> str:
    """``limit N bytes, K3FLEET_MAX_X_BYTES raises it``: the tail of every cap message."""
    cap = CAPS[kind]
    return f"limit {cap.limit()} bytes; {cap.env} raises it"


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_bytes(text: str, name: str) -> int:
    """``1048576``, ``512K``, ``64M``, ``2G`` (powers of 1024) -> bytes; anything else is one line."""
    m = _SIZE.match(text)
    if m is None:
        raise UsageError(f"{name}={text!r}: give a whole number of bytes, optionally with K, M or G (64M)")
    value = int(m.group(1)) * (1024 ** "_kmgt".index(m.group(2).lower() or "_"))
    if value < 1:
        raise UsageError(f"{name}={text!r}: must be at least 1 byte")
    return value


# -- files the user names ------------------------------------------------------------------------


def file_type(mode: int) -> str:
    """What a path of ``mode`` is, as a phrase ("a FIFO"): the one wording for refused files."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: Path, label: str, kind: str) -> IO[bytes]:
    """``path`` opened for reading if it is a regular file (a symlink to one is fine); every other
    outcome is one UsageError line. O_NONBLOCK keeps the open itself from waiting on a FIFO that
    replaced the file after the check; the descriptor is checked again with fstat."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise UsageError(f"{label} does not exist") from exc
    except OSError as exc:
        raise UsageError(f"cannot read {label}: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{label} is a directory, not {kind}")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{label} is {file_type(st.st_mode)}, not {kind}: give a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except IsADirectoryError as exc:
        raise UsageError(f"{label} is a directory, not {kind}") from exc
    except OSError as exc:
        raise UsageError(f"cannot read {label}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{label} is {file_type(st.st_mode)}, not {kind}: give a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class BoundedGunzip(io.RawIOBase):
    """gzip decompressed as a stream: at most ``max_out`` bytes out and ``max_members`` members.

    Never holds more than one chunk of compressed or decompressed data; a bomb stops at the cap.
    Damage reads as the standard library's own errors (``gzip.BadGzipFile``, ``EOFError``).
    """

    def __init__(self, raw: IO[bytes], *, max_out: int, too_large: Callable[[str], Exception],
                 max_members: int = MAX_GZIP_MEMBERS) -> None:
        super().__init__()
        self._raw = raw
        self._max_out = max_out
        self._max_members = max_members
        self._too_large = too_large
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._members = 1
        self._out = 0
        self._pending = b""
        self._done = False

    def readable(self) -> bool:
        return True

    def _input(self) -> bytes:
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        return self._raw.read(_CHUNK)

    def _next_member(self) -> bool:
        """After a member's end: start the next one, or say the stream is over."""
        tail = self._d.unused_data
        while len(tail) < 2:
            more = self._raw.read(_CHUNK)
            if not more:
                break
            tail += more
        if not tail or not tail.strip(b"\0"):
            return False  # end of input, or the zero padding some writers add
        if not tail.startswith(b"\x1f\x8b"):
            raise gzip.BadGzipFile("trailing garbage after the last gzip member")
        self._members += 1
        if self._members > self._max_members:
            raise self._too_large(f"more than {self._max_members} gzip members")
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = tail
        return True

    def readinto(self, buffer: Any) -> int:
        want = len(buffer)
        while want and not self._done:
            if self._d.eof:
                if not self._next_member():
                    self._done = True
                    break
                continue
            data = self._d.unconsumed_tail or self._input()
            if not data:
                raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            try:
                out = self._d.decompress(data, want)
            except zlib.error as exc:
                raise gzip.BadGzipFile(f"not a valid gzip stream ({exc})") from exc
            if out:
                self._out += len(out)
                if self._out > self._max_out:
                    raise self._too_large(f"more than {self._max_out} bytes decompressed")
                buffer[: len(out)] = out
                return len(out)
        return 0


def _read_capped(fh: IO[bytes], cap: int, too_large: Callable[[], Exception]) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = fh.read(min(_CHUNK, cap + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > cap:
            raise too_large()
        chunks.append(chunk)


def read_input(path: Path, what: str, *, kind: str, limit: str | None = None, max_bytes: int | None = None,
               text: bool = False) -> bytes:
    """The bytes of a file the user named (a journal, a log, a capture), at most its cap.

    ``kind`` says what the file should be ("a text log"), ``limit`` names its row of ``CAPS``
    (``max_bytes`` overrides the number); gzip input of a kind that allows it is decompressed
    under the same cap. Every way it can fail is one UsageError line naming ``what``, the path,
    ``kind`` and the cap.
    """
    label = f"{what} {path}" if what else str(path)
    row = CAPS.get(limit) if limit is not None else None
    cap = max_bytes if max_bytes is not None else (row.limit() if row is not None else None)
    hint = f"limit {cap} bytes; {row.env} raises it" if row is not None and max_bytes is None else f"limit {cap}"
    with open_regular(path, label, kind) as fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            if cap is not None and size > cap:
                raise InputTooLarge(f"{label} is {size} bytes: too large for {kind} ({hint})")
            head = fh.read(2)
            fh.seek(0)
            if row is not None and row.gzip and head == b"\x1f\x8b":
                data = _read_gzip(fh, label, kind, cap, hint)
            elif cap is None:
                data = fh.read()
            else:
                data = _read_capped(fh, cap, lambda: InputTooLarge(
                    f"{label} grew past {cap} bytes while read: too large for {kind} ({hint})"))
        except OSError as exc:
            raise UsageError(f"cannot read {label}: {exc.strerror or exc}") from exc
    if text and b"\x00" in data[:_BINARY_PROBE]:
        raise UsageError(f"{label} is binary, not {kind}")
    return data


# -- structure: nesting and expansion ----------------------------------------------------------------
# A parser that recurses (json's, PyYAML's composer, pydantic, the redactor) meets its end at Python's
# recursion limit; a YAML alias multiplies what it names. Both are bounded before anything recurses or
# expands: real inputs (facts, verdicts, events, profiles, tool schemas) nest a few dozen levels at most.

MAX_NESTING = 128  # levels of arrays/objects (JSON) or sequences/mappings (YAML)
# Nodes a YAML document may hold once its aliases are expanded: far above any profile, owners or build file
# (8 MiB of plain YAML is well under it), far below a "billion laughs" (9 levels of 9 aliases: 387 million).
MAX_YAML_NODES = 2_000_000
# ... and more than this many times the nodes as written: a 100,000-host inventory (2 million nodes, no aliases)
# is no bomb, whatever its size (its bytes are capped on their own).
_MAX_EXPANSION = 10

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_JSON_PAIR = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class JSONTooDeep(json.JSONDecodeError):
    """JSON nested deeper than ``MAX_NESTING``: a ValueError (a JSONDecodeError), so every reader's handler
    for malformed JSON words it, in one line, before anything recursed into it."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nested deeper than {limit} levels", "", 0)
        self.args = (f"nested deeper than {limit} levels of arrays and objects (k3fleet's limit)",)

    def __str__(self) -> str:
        return str(self.args[0])


def json_too_deep(data: bytes | str, limit: int = MAX_NESTING) -> bool:
    """Whether ``data`` (JSON text) nests arrays and objects more than ``limit`` levels, in linear time and
    without recursion: strings are removed, then the innermost ``[]``/``{}`` pairs, one level per pass."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        brackets, n = _JSON_PAIR.subn(b"", brackets)
        if not brackets or n == 0:
            return False  # all matched within the limit, or not JSON (json.loads then says where)
    return bool(brackets) and (b"[]" in brackets or b"{}" in brackets)


def loads_json(data: bytes | str, limit: int = MAX_NESTING) -> Any:
    """``json.loads`` with a nesting limit: too deep is ``JSONTooDeep`` (a ValueError) instead of a
    RecursionError here or in whatever walks the result later."""
    if json_too_deep(data, limit):
        raise JSONTooDeep(limit)
    try:
        return json.loads(data)
    except RecursionError:
        raise JSONTooDeep(limit) from None


def parse_json(data: bytes, label: str) -> Any:
    """``data`` parsed as JSON; not UTF-8, not JSON or nested too deep is one UsageError line:
    ``<label> is not readable JSON``."""
    try:
        return loads_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{label} is not readable JSON: {exc}") from exc


def _yaml_loader() -> Any:
    # lazy: PyYAML is imported by the readers of YAML only (bounds is on every command's path)
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_yaml(text: str, label: str, *, limit: int = MAX_NESTING, max_nodes: int = MAX_YAML_NODES) -> None:
    """Refuse YAML that nests more than ``limit`` levels or holds more than ``max_nodes`` nodes once its
    aliases are expanded (and more than ten times the nodes as written), from the parser's events alone (no
    recursion, nothing expanded): one UsageError line naming ``label``. Text that does not parse is left to the
    loader, which says where."""
    import yaml  # lazy: see _yaml_loader

    loader = _yaml_loader()(text)
    sizes: dict[str, int] = {}
    stack: list[list[Any]] = []  # [expanded nodes so far, anchor] per open collection
    total = 0
    written = 0  # nodes as written (an alias counts one): a large document without aliases is no bomb

    def add(n: int) -> None:
        nonlocal total
        if stack:
            stack[-1][0] += n
            grown = stack[-1][0]
        else:
            total += n
            grown = total
        if grown > max_nodes and grown > _MAX_EXPANSION * written:
            raise InputTooLarge(f"{label}: YAML with more than {max_nodes} nodes once its aliases are expanded "
                                "(an alias bomb?): refused before it is loaded")

    try:
        while loader.check_event():
            ev = loader.get_event()
            written += 1
            if isinstance(ev, yaml.CollectionStartEvent):
                stack.append([1, ev.anchor])
                if len(stack) > limit:
                    raise UsageError(f"{label}: YAML nested deeper than {limit} levels (k3fleet's limit): "
                                     "refused before it is loaded")
            elif isinstance(ev, yaml.CollectionEndEvent):
                n, anchor = stack.pop()
                if anchor is not None:
                    sizes[anchor] = n
                add(n)
            elif isinstance(ev, yaml.ScalarEvent):
                if ev.anchor is not None:
                    sizes[ev.anchor] = 1
                add(1)
            elif isinstance(ev, yaml.AliasEvent):
                add(sizes.get(ev.anchor or "", 1))
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):  # libyaml's own stop, at 1000 levels of flow collections
            raise UsageError(f"{label}: YAML nested deeper than {limit} levels (k3fleet's limit): refused before "
                             "it is loaded") from None
        return  # malformed: the loader says where, in its own words
    finally:
        loader.dispose()


def load_yaml(text: str, label: str) -> Any:
    """``yaml.safe_load`` of user YAML after ``check_yaml``'s depth and alias budget: a bomb or a deep
    nest is one UsageError line; malformed YAML raises ``yaml.YAMLError`` as before, for the caller to word."""
    import yaml  # lazy: see _yaml_loader

    check_yaml(text, label)
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise UsageError(f"{label}: YAML nested deeper than {MAX_NESTING} levels (k3fleet's limit)") from None


def read_json(path: Path, what: str, *, kind: str = "a JSON file", limit: str = "run_json") -> Any:
    """The one reader of a JSON file outside a run directory (run files: ``k3fleet.evidence.reader``):
    ``read_input``'s checks and cap, then ``parse_json``; every failure one UsageError line naming ``what``."""
    return parse_json(read_input(path, what, kind=kind, limit=limit), f"{what} {path}" if what else str(path))


def read_bounded(path: Path, limit: str) -> bytes:
    """``path.read_bytes()`` under the ``limit`` cap, for files inside run directories: the same
    exception types (OSError subclasses), so callers' existing handlers word them, but a FIFO, a
    device or an oversize file is an OSError naming itself, never a hang or a MemoryError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{file_type(st.st_mode)}, not a regular file", str(path))
        cap = cap_bytes(limit)
        if st.st_size > cap:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, above the limit ({limit_hint(limit)})", str(path))
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as fh:
            return _read_capped(fh, cap, lambda: OSError(errno.EFBIG, f"grew past the limit ({limit_hint(limit)})",
                                                         str(path)))
    finally:
        os.close(fd)


# Linux's NAME_MAX and PATH_MAX (limits.h): a longer name fails every call with ENAMETOOLONG.
NAME_MAX = 255
PATH_MAX = 4096


def check_path_name(path: Path, what: str) -> None:
    """Refuse a path the file system cannot hold (a part above NAME_MAX bytes, the whole above PATH_MAX) in
    one line, before any call on it raises ENAMETOOLONG from somewhere deep."""
    for part in Path(path).parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            raise UsageError(f"{what}: a name of {size} bytes ({part[:24]}...): file names are at most {NAME_MAX} "
                             "bytes")
    size = len(os.fsencode(str(path)))
    if size > PATH_MAX:
        raise UsageError(f"{what}: a path of {size} bytes: paths are at most {PATH_MAX} bytes")


def check_input(path: Path, what: str, *, kind: str, limit: str) -> None:
    """Refuse ``path`` now, the way ``read_input`` would later (not a regular file, above its cap),
    without reading it: for inputs a long command reads only at its end."""
    label = f"{what} {path}" if what else str(path)
    with open_regular(path, label, kind) as fh:
        size = os.fstat(fh.fileno()).st_size
    if size > cap_bytes(limit):
        raise InputTooLarge(f"{label} is {size} bytes: too large for {kind} ({limit_hint(limit)})")


def _read_gzip(fh: IO[bytes], label: str, kind: str, cap: int | None, hint: str) -> bytes:
    def too_large(why: str) -> InputTooLarge:
        return InputTooLarge(f"{label}: gzip data with {why}: too large for {kind} ({hint})")

    limit = cap if cap is not None else 1 << 62
    stream = BoundedGunzip(fh, max_out=limit, too_large=too_large)
    try:
        return _read_capped(io.BufferedReader(stream, _CHUNK), limit,
                        lambda: too_large(f"more than {limit} bytes decompressed"))
    except (EOFError, gzip.BadGzipFile) as exc:
        raise UsageError(f"{label} is damaged gzip data ({exc}), not {kind}") from exc


class _BoundedTar(tarfile.TarFile):
    """A tar stream whose members are refused, by their declared size, above the member cap."""

    # Class attributes, set on a subclass per archive: TarFile.__init__ already reads the first member.
    member_cap: int = 0
    label: str = ""

    def next(self) -> tarfile.TarInfo | None:
        member = super().next()
        if member is not None and member.size > self.member_cap:
            raise InputTooLarge(f"{self.label}: member {member.name} is {member.size} bytes decompressed: too "
                                f"large for an evidence package ({limit_hint('package_member')})")
        return member


@contextmanager
def open_tar(archive: Path, label: str = "") -> Iterator[tarfile.TarFile]:
    """A gzip'd tar archive (an evidence package) opened as a stream under the ``package`` caps.

    Members are read in order only (tarfile's stream mode). Damage surfaces as tarfile's, gzip's
    or EOF errors, as with ``tarfile.open(mode="r:gz")``.
    """
    label = label or str(archive)
    total = cap_bytes("package")

    def too_large(why: str) -> InputTooLarge:
        return InputTooLarge(f"{label}: {why}: too large for an evidence package ({limit_hint('package')})")

    with open_regular(archive, label, "an evidence package") as fh:
        stream = io.BufferedReader(BoundedGunzip(fh, max_out=total, too_large=too_large), _CHUNK)
        bounded: type[_BoundedTar] = type("_Tar", (_BoundedTar,), {"member_cap": cap_bytes("package_member"),
                                                                   "label": label})
        tar = bounded.open(fileobj=stream, mode="r|")
        with tar:
            yield tar


# -- durations -------------------------------------------------------------------------------------

_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0


@dataclass(frozen=True)
class Span:
    """The range a seconds option may take."""

    low: float
    high: float
    low_inclusive: bool = True  # False: the value must be above ``low`` (zero makes no sense)


# The one table of seconds options: each is finite and within its range, or refused.
DURATIONS: dict[str, Span] = {
    "watch --for": Span(1.0, 7 * _DAY),
    "watch --interval": Span(0.1, _DAY),
    "request --timeout": Span(0.1, _HOUR),  # accept *, accept load: the whole request, connect to last byte
    "audit --command-timeout": Span(0.1, _HOUR),
    "audit --host-timeout": Span(1.0, _DAY),
    "--drain-timeout": Span(0.0, 7 * _DAY),
    "--audit-max-age": Span(1.0, 30 * _DAY),
    "--pause-timeout": Span(1.0, 7 * _DAY),
    "load step": Span(0.0, _DAY, low_inclusive=False),  # step_s, sustained_s, max_duration_s, sample_interval_s
    "load slo": Span(0.0, _HOUR, low_inclusive=False),  # ttft_p95_slo_s, itl_p95_slo_s
    "prune --older-than": Span(1.0, 3650 * _DAY),
    "--max-age": Span(1.0, 3650 * _DAY),  # verify-evidence, watch: how old an approval may be
}

_UNITS = {"s": 1.0, "m": _MINUTE, "h": _HOUR, "d": _DAY}


def _human(seconds: float) -> str:
    for unit, size in (("d", _DAY), ("h", _HOUR), ("m", _MINUTE)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def check_seconds(value: float, span: str) -> str | None:
    """Why ``value`` is not a valid ``span`` duration (None: it is)."""
    rng = DURATIONS[span]
    if not math.isfinite(value):
        return "is not a finite number of seconds"
    if rng.low_inclusive and value < rng.low:
        return "must not be negative" if rng.low == 0 else f"must be at least {_human(rng.low)}"
    if not rng.low_inclusive and value <= rng.low:
        return "must be positive" if rng.low == 0 else f"must be above {_human(rng.low)}"
    if value > rng.high:
        return f"is above the maximum of {_human(rng.high)}"
    return None


def parse_seconds(text: object, flag: str, span: str, *, units: bool = True) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` (or a plain number without ``units``) -> seconds,
    finite and within ``DURATIONS[span]``; anything else is one UsageError line naming ``flag``."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
        shown = repr(text)
    else:
        t = str(text).strip().lower()
        shown = repr(str(text))
        scale = 1.0
        if units and t and t[-1] in _UNITS:
            scale, t = _UNITS[t[-1]], t[:-1]
        try:
            value = float(t) * scale
        except ValueError:
            how = "seconds or a number with s, m, h or d (15m)" if units else "a number of seconds"
            raise UsageError(f"{flag} {shown}: give {how}") from None
    problem = check_seconds(value, span)
    if problem is not None:
        raise UsageError(f"{flag} {shown} {problem}")
    return value


def seconds_option(flag: str, span: str, *, units: bool = False) -> Callable[[Any], float]:
    """A Typer ``parser=`` for a seconds option: the value parsed by ``parse_seconds``."""

    def parse(value: Any) -> float:
        return parse_seconds(value, flag, span, units=units)

    return parse


def whole_seconds_option(flag: str, span: str) -> Callable[[Any], int]:
    """A Typer ``parser=`` for a seconds option that must be a whole number."""

    def parse(value: Any) -> int:
        seconds = parse_seconds(value, flag, span, units=False)
        if seconds != int(seconds):
            raise UsageError(f"{flag} {value!r}: give a whole number of seconds")
        return int(seconds)

    return parse
