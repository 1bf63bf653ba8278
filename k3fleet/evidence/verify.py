"""Verify a run directory against its manifest: missing, changed and extra files.

Readers verify before they trust (``plan``, ``upgrade --resume``, ``rollback --run``):
``verify_run(path).raise_if_bad()`` raises IncompleteError (exit 3) with one line.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, Field

from k3fleet.bounds import loads_json, read_bounded
from k3fleet.errors import IncompleteError, UsageError
from k3fleet.evidence.layout import COMMAND, MANIFEST
from k3fleet.evidence.writer import sha256_file

_LISTED = 5


class VerifyReport(BaseModel):
    """What ``k3fleet verify`` found in one run directory."""

    path: str
    has_manifest: bool = Field(description="false: the run never finished (interrupted or killed)")
    problem: str | None = Field(default=None, description="why the manifest itself cannot be used")
    files: int = Field(default=0, description="files the manifest lists")
    missing: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list)
    extra: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.has_manifest and self.problem is None and not (self.missing or self.changed or self.extra)

    @property
    def problems(self) -> list[str]:
        """Every difference as ``path: what`` (empty when intact)."""
        if self.problem:
            return [self.problem]
        return ([f"{p}: missing" for p in self.missing] + [f"{p}: changed" for p in self.changed]
                + [f"{p}: not in the manifest" for p in self.extra])

    def summary(self) -> str:
        """One line: intact, or what is wrong with the first few paths named."""
        if self.ok:
            return f"run {self.path}: intact ({self.files} files match the manifest)"
        if self.problem:
            return f"run {self.path}: {self.problem}"
        parts = []
        for what, paths in (("missing", self.missing), ("changed", self.changed), ("extra", self.extra)):
            if paths:
                more = f" (+{len(paths) - _LISTED} more)" if len(paths) > _LISTED else ""
                shown = ", ".join(paths[:_LISTED]) + more
                parts.append(f"{len(paths)} {what}: {shown}")
        return f"run {self.path} does not match its manifest: " + "; ".join(parts)

    def raise_if_bad(self) -> None:
        if not self.ok:
            raise IncompleteError(self.summary())


def manifest_entries(data: object) -> list[tuple[str, str]] | None:
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None
    out = []
    for e in data["files"]:
        if not isinstance(e, dict) or not isinstance(e.get("path"), str) or not isinstance(e.get("sha256"), str):
            return None
        rel = PurePosixPath(e["path"])
        if rel.is_absolute() or ".." in rel.parts or not e["path"]:
            return None
        out.append((e["path"], e["sha256"]))
    return out


def verify_run(path: Path | str) -> VerifyReport:
    """Check every file of the run directory at ``path`` against its manifest.json.

    Raises UsageError (exit 2) only when ``path`` is not a run directory at all; everything else
    (no manifest: the run did not finish; an unreadable manifest; missing, changed or extra
    files) is in the report.
    """
    root = Path(path)
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory: give a k3fleet run directory")
    manifest = root / MANIFEST
    if not manifest.is_file():
        if not (root / COMMAND).is_file():
            raise UsageError(f"{root} is not a k3fleet run directory (no {COMMAND} or {MANIFEST})")
        return VerifyReport(path=str(root), has_manifest=False,
                            problem=f"no {MANIFEST}: the run did not finish (interrupted or killed); "
                                    "its evidence is incomplete")
    try:
        data = loads_json(read_bounded(manifest, "run_json").decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return VerifyReport(path=str(root), has_manifest=True,
                            problem=f"{MANIFEST} cannot be read: {type(exc).__name__}: {exc}")
    entries = manifest_entries(data)
    if entries is None:
        return VerifyReport(path=str(root), has_manifest=True,
                            problem=f"{MANIFEST} is not a k3fleet manifest (expected files: [{{path, sha256}}])")
    listed = dict(entries)
    report = VerifyReport(path=str(root), has_manifest=True, files=len(listed))
    for rel, digest in sorted(listed.items()):
        p = root / rel
        if p.is_symlink() or not p.is_file():
            report.missing.append(rel)
            continue
        try:
            if sha256_file(p) != digest:
                report.changed.append(rel)
        except OSError:
            report.missing.append(rel)
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel == MANIFEST or rel in listed or (p.is_dir() and not p.is_symlink()):
            continue
        report.extra.append(rel)
    return report
