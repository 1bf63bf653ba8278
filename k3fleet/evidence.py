"""The run directory: every run leaves evidence (docs/architecture.md principle 5).

A run directory holds the command, inputs, events, per-host facts, findings, verdict,
journal and rendered reports, with a sha256 manifest written last. Secrets never enter
it: values of tokens, passwords and keys in the environment or on the command line are
redacted before anything is written.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from k3fleet import __version__
from k3fleet.errors import UsageError

MANIFEST = "manifest.json"
REDACTED = "***"

# Key names whose values are secrets. Word edges matter: "passed", "prompt_tokens" and "author"
# are evidence, "ansible_ssh_pass", "HF_TOKEN" and "Authorization" are not.
_SECRET_NAME = re.compile(
    r"(passw(or)?d|passphrase|(^|[_.-])pass($|[_.-])|secret|token(?![a-z])|api[_-]?key|private[_-]?key"
    r"|credential|(^|[_.-])auth(orization)?($|[_.-]))",
    re.IGNORECASE)
# KEY=value and KEY: value forms inside free text; the key decides.
_INLINE = re.compile(r"(?P<k>[\w.-]+)(?P<sep>=|:\s*)(?P<v>(?:(?:bearer|basic)\s+)?[^\s'\"]+)", re.IGNORECASE)
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_text(text: str) -> str:
    text = _INLINE.sub(lambda m: f"{m.group('k')}{m.group('sep')}{REDACTED}" if is_secret_name(m.group("k"))
                       else m.group(0), text)
    return _BEARER.sub(lambda m: m.group(1) + REDACTED, text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Redact ``--token X``, ``--token=X`` and ``KEY=secret`` forms."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and "=" not in arg and is_secret_name(arg):
            out.append(arg)
            hide_next = True
            continue
        out.append(redact_text(arg))
    return out


def redact(obj: Any) -> Any:
    """Redact secrets anywhere in a JSON-like structure (by key name and inline forms)."""
    if isinstance(obj, Mapping):
        return {k: (REDACTED if isinstance(k, str) and is_secret_name(k) and isinstance(v, str | int)
                    else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def _utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def new_run_id(kind: str) -> str:
    return f"{_utcnow().strftime('%Y%m%dT%H%M%SZ')}-{kind}-{secrets.token_hex(3)}"


class RunDir:
    """One run's evidence directory. Files are written through it so the manifest sees them all."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, base: Path, kind: str, argv: Sequence[str], *, out: Path | None = None) -> RunDir:
        path = out if out is not None else base / new_run_id(kind)
        if path.exists() and any(path.iterdir()):
            raise UsageError(f"run directory {path} exists and is not empty: choose another --out")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create run directory {path}: {exc.strerror or exc}") from exc
        rd = cls(path)
        env = {k: (REDACTED if is_secret_name(k) else v) for k, v in os.environ.items()
               if k.startswith(("K3FLEET_", "ANSIBLE_", "NCCL_", "VLLM_"))}
        rd.write_json("command.json", {
            "kind": kind,
            "argv": redact_argv(list(argv)),
            "cwd": str(Path.cwd()),
            "k3fleet_version": __version__,
            "user": _user(),
            "controller": socket.gethostname(),
            "started_at": _utcnow().isoformat(timespec="seconds"),
            "env": env,
        })
        return rd

    @classmethod
    def open(cls, path: Path) -> RunDir:
        if not (path / "command.json").is_file():
            raise UsageError(f"{path} is not a k3fleet run directory (no command.json)")
        return cls(path)

    def file(self, rel: str) -> Path:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def write_json(self, rel: str, data: Any) -> Path:
        p = self.file(rel)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(redact(data), indent=2, sort_keys=False, default=str) + "\n")
        tmp.replace(p)
        return p

    def write_text(self, rel: str, text: str) -> Path:
        p = self.file(rel)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(redact_text(text))
        tmp.replace(p)
        return p

    def write_jsonl(self, rel: str, rows: Iterable[Mapping[str, Any]]) -> Path:
        p = self.file(rel)
        with p.open("w") as fh:
            for row in rows:
                fh.write(json.dumps(redact(row), default=str) + "\n")
        return p

    def append_jsonl(self, rel: str, row: Mapping[str, Any]) -> None:
        """Append one line and flush it to disk: a journal must survive a killed controller."""
        p = self.file(rel)
        with p.open("a") as fh:
            fh.write(json.dumps(redact(row), default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def copy_input(self, src: Path, rel: str) -> Path | None:
        if not src.exists():
            return None
        dest = self.file(rel)
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            dest.write_text(redact_text(src.read_text(errors="replace")))
        return dest

    def read_json(self, rel: str) -> Any:
        p = self.path / rel
        try:
            return json.loads(p.read_text())
        except FileNotFoundError as exc:
            raise UsageError(f"{p} is missing: the run directory is incomplete") from exc
        except json.JSONDecodeError as exc:
            raise UsageError(f"{p} is not valid JSON: {exc.msg} at line {exc.lineno}") from exc

    def write_manifest(self) -> Path:
        entries = []
        for p in sorted(self.path.rglob("*")):
            if p.is_file() and p.name != MANIFEST:
                entries.append({"path": p.relative_to(self.path).as_posix(), "sha256": sha256_file(p),
                                "bytes": p.stat().st_size})
        return self.write_json(MANIFEST, {"algorithm": "sha256", "files": entries,
                                          "written_at": _utcnow().isoformat(timespec="seconds")})

    def verify_manifest(self) -> list[str]:
        """Files whose content no longer matches the manifest (or that vanished)."""
        data = self.read_json(MANIFEST)
        bad = []
        for e in data.get("files", []):
            p = self.path / e["path"]
            if not p.is_file() or sha256_file(p) != e["sha256"]:
                bad.append(e["path"])
        return bad


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
