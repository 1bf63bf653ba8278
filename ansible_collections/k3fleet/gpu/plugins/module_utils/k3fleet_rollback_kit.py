# -*- coding: utf-8 -*-
# Stdlib only: shipped to nodes inside AnsiballZ.
"""The rollback kit: the exact driver packages a node runs before its first change, kept on the node.

A rollback puts back the snapshot's exact package versions (docs/change-night.md "Rollback"). A
mirror that keeps only the newest versions, or a repository that cannot be reached during the
night, would leave the node on the new driver with no way back. So before the first change the
packages the node runs now (every package of a driver branch: driver, Fabric Manager, userspace,
compat, kernel modules) are fetched onto the node, into one directory per change
(``/var/lib/k3fleet/rollback-kit/<change-id>/``), each with its sha256; the journal keeps the list
(docs/change-night.md "Rollback kit").

Where each package comes from, in this order: a file already in the kit whose sha256 is the one the
kit recorded; apt's own cache (``/var/cache/apt/archives``), when the file there is that exact
package; ``apt-get download NAME:ARCH=VERSION`` from the node's repositories. Every file is checked
with ``dpkg-deb --field`` (its Package, Version and Architecture must be the installed ones) before
it is counted. dnf nodes are refused: ``dnf download`` is written nowhere here and has never run.

A rollback installs from the repository when it still offers every version (``apt-cache policy``
lists a source other than dpkg's status file), else from the kit, after checking every file's sha256
against the journal's record.

Parsing and decisions are pure functions; ``make_kit`` and ``inspect`` run commands through a
``NodeReader`` (``k3fleet_cmd``), so the same code reads a real node or a test tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import CommandResult, NodeReader

KIT_ROOT = "/var/lib/k3fleet/rollback-kit"
MANIFEST = "kit.json"
SCHEMA = 1
APT_ARCHIVES = "/var/cache/apt/archives"
# dpkg's "Architecture: all" packages carry no arch qualifier in dpkg-query's ${Package}.
_CHANGE_DIR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_VERSION_LINE = re.compile(r"^(?: \*\*\*|    ) (?P<version>\S+) (?P<priority>-?\d+)$")
_SOURCE_LINE = re.compile(r"^ {8}(?P<priority>-?\d+) (?P<source>.+)$")


def kit_packages(packages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The packages a kit holds: every package of a driver branch in a snapshot's package list
    (the ones a rollback restores: ``nvidia_driver`` vars ``_nvidia_driver_rb_pkgs``), as
    ``{name, version, arch, held}`` sorted by name. Raises ValueError on an entry without a name
    or version."""
    out = []
    for p in packages or []:
        if not isinstance(p, dict) or not p.get("branch"):
            continue
        name, version = p.get("name"), p.get("version")
        if not name or not version:
            raise ValueError("snapshot package without a name or version: %r" % (p,))
        out.append({"name": str(name), "version": str(version), "arch": p.get("arch") or None,
                    "held": bool(p.get("held"))})
    return sorted(out, key=lambda p: p["name"])


def kit_dir(root: str, change_id: str | None) -> str:
    """The kit directory of one change under ``root`` (KIT_ROOT); the change id is its last part."""
    if not _CHANGE_DIR.match(change_id or ""):
        raise ValueError("change id %r cannot name a kit directory (letters, digits, '.', '_', '-')" % (change_id,))
    return os.path.join(root, str(change_id))


def deb_file_name(name: str, version: str, arch: str | None) -> str:
    """The file name apt gives a downloaded package: ``name_version_arch.deb``, the epoch's colon
    written ``%3a`` (apt's URI quoting of the version)."""
    return "%s_%s_%s.deb" % (name, version.replace(":", "%3a"), arch or "all")


def apt_spec(pkg: dict[str, Any]) -> str:
    """``name:arch=version`` (``name=version`` without an arch): one exact package for apt-get."""
    return "%s%s=%s" % (pkg["name"], (":" + pkg["arch"]) if pkg.get("arch") else "", pkg["version"])


def parse_policy(text: str | None) -> dict[str, dict[str, Any]]:
    """Parse ``LC_ALL=C apt-cache policy NAME...``: ``{name: {installed, candidate, versions:
    {version: [sources]}}}``. A source is the text after the priority (``file:/srv/repo ./ Packages``,
    ``/var/lib/dpkg/status``). A name apt does not know prints nothing and is absent from the result.
    Raises ValueError on a version table line that belongs to no package."""
    out: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    version = None
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        if not line.startswith(" ") and line.endswith(":"):
            current = {"installed": None, "candidate": None, "versions": {}}
            out[line[:-1].split(":", 1)[0] if line.count(":") > 1 else line[:-1]] = current
            version = None
            continue
        if current is None:
            raise ValueError("apt-cache policy line outside a package: %r" % line[:160])
        stripped = line.strip()
        if stripped.startswith("Installed:"):
            value = stripped.split(":", 1)[1].strip()
            current["installed"] = None if value == "(none)" else value
            continue
        if stripped.startswith("Candidate:"):
            value = stripped.split(":", 1)[1].strip()
            current["candidate"] = None if value == "(none)" else value
            continue
        if stripped == "Version table:":
            continue
        m = _VERSION_LINE.match(line)
        if m:
            version = m.group("version")
            current["versions"].setdefault(version, [])
            continue
        m = _SOURCE_LINE.match(line)
        if m and version is not None:
            current["versions"][version].append(m.group("source").strip())
            continue
        # Other lines (a pin's "Package pin:") say nothing about where a version comes from.
    return out


def is_repository(source: str) -> bool:
    """A version table source that is a repository's index (``URI SUITE [COMPONENT ARCH] Packages``), not
    dpkg's status file (one path: ``/var/lib/dpkg/status``, or wherever ``Dir::State::status`` points)."""
    return len(source.split()) > 1


def offered(policy: dict[str, dict[str, Any]], name: str, version: str) -> bool:
    """True when a repository (any source but dpkg's status file) offers ``name`` at ``version``."""
    sources = ((policy.get(name) or {}).get("versions") or {}).get(version) or []
    return any(is_repository(s) for s in sources)


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def parse_deb_fields(text: str | None) -> dict[str, str]:
    """``dpkg-deb --field FILE Package Version Architecture`` output -> {Package, Version, Architecture}."""
    out = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key and not key.startswith(" "):
            out[key.strip()] = value.strip()
    return out


def deb_matches(fields: dict[str, str], pkg: dict[str, Any]) -> str | None:
    """Why a .deb is not the package ``pkg`` (name, version, arch), or None when it is."""
    want = {"Package": pkg["name"], "Version": pkg["version"]}
    if pkg.get("arch"):
        want["Architecture"] = pkg["arch"]
    wrong = ["%s %s (want %s)" % (k, fields.get(k) or "missing", v) for k, v in sorted(want.items())
             if fields.get(k) != v]
    return "; ".join(wrong) or None


def verify_entries(directory: str, entries: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """Check each recorded kit entry (``file``, ``sha256``) against the files in ``directory``:
    ``{file: "ok" | "missing" | "changed"}`` and the problems as lines (empty when all are ok)."""
    states, problems = {}, []
    for e in entries:
        path = os.path.join(directory, e.get("file") or "")
        if not e.get("file") or not os.path.isfile(path):
            states[e.get("file") or "?"] = "missing"
            problems.append("%s: %s is missing" % (apt_spec(e), path))
            continue
        digest = sha256_file(path)
        if digest != e.get("sha256"):
            states[e["file"]] = "changed"
            problems.append("%s: %s has sha256 %s, the kit recorded %s" % (apt_spec(e), path, digest, e.get("sha256")))
        else:
            states[e["file"]] = "ok"
    return states, problems


def read_manifest(directory: str) -> dict[str, Any] | None:
    """The kit's own record (``kit.json``), or None when there is none or it cannot be read."""
    try:
        with open(os.path.join(directory, MANIFEST), "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("packages"), list) else None


def write_manifest(directory: str, data: dict[str, Any]) -> None:
    """Write ``kit.json`` whole or not at all (a temporary file, fsync, rename, fsync of the directory)."""
    fd, tmp = tempfile.mkstemp(prefix=".kit-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write((json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.join(directory, MANIFEST))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _fields(reader: NodeReader, path: str) -> tuple[dict[str, str] | None, str | None]:
    res = reader.run(["dpkg-deb", "--field", path, "Package", "Version", "Architecture"])
    if not res.ok:
        return None, res.reason()
    return parse_deb_fields(res.stdout), None


def _arch_of(reader: NodeReader, pkg: dict[str, Any]) -> tuple[str | None, str | None]:
    """The package's architecture: recorded in the snapshot, else dpkg's for the installed package."""
    if pkg.get("arch"):
        return pkg["arch"], None
    res = reader.run(["dpkg-query", "-W", "-f=${Architecture}", pkg["name"]])
    if res.ok and res.stdout.strip():
        return res.stdout.strip().splitlines()[0], None
    return None, res.reason()


def make_kit(reader: NodeReader, directory: str, packages: list[dict[str, Any]], check_mode: bool = False,
             change_id: str | None = None, made_at: str | None = None) -> dict[str, Any]:
    """Fetch every package of ``packages`` (``kit_packages``) into ``directory``, record their sha256
    in ``kit.json``. Idempotent: a file the kit already holds with its recorded sha256 is kept.

    Returns ``{"path", "packages": [entry...], "fetched": [...], "problems": [...], "changed"}``; each
    entry is ``{name, version, arch, held, file, sha256, size, from}`` (from: kit, apt-cache, repository).
    ``problems`` lists each package that could not be had, with apt's own words; the kit is complete
    only when it is empty. In check mode nothing is written: ``fetched`` says what would be."""
    result: dict[str, Any] = {"path": directory, "packages": [], "fetched": [], "problems": [], "changed": False}
    real_dir = reader.join_root(directory)
    before = read_manifest(real_dir) or {"packages": []}
    recorded = dict((e.get("file"), e) for e in before["packages"] if isinstance(e, dict))
    created = not check_mode and not os.path.isdir(real_dir)
    if created:
        os.makedirs(real_dir, 0o700)
    staging = None
    try:
        for pkg in packages:
            arch, why = _arch_of(reader, pkg)
            if arch is None:
                result["problems"].append("%s: architecture unknown: %s" % (apt_spec(pkg), why))
                continue
            pkg = dict(pkg, arch=arch)
            name = deb_file_name(pkg["name"], pkg["version"], arch)
            entry = dict(pkg, file=name)
            target = os.path.join(real_dir, name)
            old = recorded.get(name)
            if old and os.path.isfile(target) and sha256_file(target) == old.get("sha256"):
                entry.update(sha256=old["sha256"], size=os.path.getsize(target), source=old.get("source", "kit"))
                result["packages"].append(entry)
                continue
            cached = reader.join_root(os.path.join(APT_ARCHIVES, name))
            fields = _fields(reader, cached)[0] if os.path.isfile(cached) else None
            if fields is not None and deb_matches(fields, pkg) is None:
                source = "apt-cache"
                if check_mode:
                    result["fetched"].append("%s from %s" % (apt_spec(pkg), cached))
                    result["packages"].append(dict(entry, source=source))
                    continue
                shutil.copyfile(cached, target + ".part")
                got = target + ".part"
            else:
                source = "repository"
                if check_mode:
                    # A read-only question: does a repository offer it? (download --print-uris fetches nothing)
                    res = reader.run(["apt-get", "download", "--print-uris", apt_spec(pkg)])
                    if not res.ok or not res.stdout.strip():
                        result["problems"].append("%s: %s" % (apt_spec(pkg), _apt_words(res)))
                    else:
                        result["fetched"].append("%s from a repository" % apt_spec(pkg))
                        result["packages"].append(dict(entry, source=source))
                    continue
                if staging is None:
                    staging = tempfile.mkdtemp(prefix=".fetch-", dir=real_dir)
                res = reader.run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", apt_spec(pkg)],
                                 cwd=staging)
                got = os.path.join(staging, name)
                if not res.ok or not os.path.isfile(got):
                    result["problems"].append("%s: %s" % (apt_spec(pkg), _apt_words(res)))
                    continue
            fields, why = _fields(reader, got)
            wrong = deb_matches(fields, pkg) if fields is not None else why
            if wrong:
                os.unlink(got)
                result["problems"].append("%s: the fetched file is not that package: %s" % (apt_spec(pkg), wrong))
                continue
            entry.update(sha256=sha256_file(got), size=os.path.getsize(got), source=source)
            os.rename(got, target)
            origin = "apt's cache" if source == "apt-cache" else "a repository"
            result["fetched"].append("%s from %s" % (apt_spec(pkg), origin))
            result["packages"].append(entry)
            result["changed"] = True
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    if created and result["problems"] and not os.listdir(real_dir):
        # Nothing could be kept: leave no empty kit behind.
        os.rmdir(real_dir)
    if not check_mode and not result["problems"]:
        manifest = {"schema": SCHEMA, "change_id": change_id, "made_at": made_at, "packages": result["packages"]}
        if before.get("packages") != result["packages"] or before.get("change_id") != change_id:
            write_manifest(real_dir, manifest)
            result["changed"] = True
    return result


def _apt_words(res: CommandResult) -> str:
    """apt's own error line (``E: ...``) when it gave one, else the command's one-line reason."""
    lines = [ln.strip() for ln in ((res.stderr or "") + "\n" + (res.stdout or "")).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E:")]
    if errors:
        return errors[0]
    return res.reason() if not res.ok else "apt-get printed no download for it"


def inspect(reader: NodeReader, packages: list[dict[str, Any]], kit: dict[str, Any] | None = None,
            policy_text: str | None = None) -> dict[str, Any]:
    """Where each package of ``packages`` (``kit_packages``) can come from now, read-only.

    ``kit`` is the kit as the journal recorded it (``{path, packages: [{file, sha256, ...}]}``) or
    None. Returns ``{"packages": [...], "repository": bool (every version offered), "kit": {...},
    "source": "repository" | "kit" | None, "why": text}``. ``policy_text`` is apt-cache policy's
    output when the caller already ran it."""
    names = sorted(set(p["name"] for p in packages))
    if policy_text is None and names:
        res = reader.run(["apt-cache", "policy"] + names)
        policy_text = res.stdout if res.ok else ""
        policy_problem = None if res.ok else res.reason()
    else:
        policy_problem = None
    try:
        policy = parse_policy(policy_text or "")
    except ValueError as exc:
        policy, policy_problem = {}, str(exc)
    rows = []
    for p in packages:
        row = dict(p, repository=offered(policy, p["name"], p["version"]))
        rows.append(row)
    repo_all = bool(rows) and all(r["repository"] for r in rows)
    kit_state: dict[str, Any] = {"path": None, "recorded": False, "complete": False, "verified": False, "problems": []}
    if kit and kit.get("path") and isinstance(kit.get("packages"), list):
        kit_state.update(path=kit["path"], recorded=True)
        by_version = dict(((e.get("name"), e.get("version")), e) for e in kit["packages"] if isinstance(e, dict))
        missing = [apt_spec(p) for p in packages if (p["name"], p["version"]) not in by_version]
        entries = [by_version[(p["name"], p["version"])] for p in packages if (p["name"], p["version"]) in by_version]
        states, problems = verify_entries(reader.join_root(kit["path"]), entries)
        problems = ["%s: not in the kit" % m for m in missing] + problems
        kit_state.update(complete=not missing, verified=not problems, problems=problems, files=states)
    if not rows:
        # Nothing to look for (no package with a driver branch was given): neither source can be
        # vouched for, rather than a kit "verified" over no files.
        source, why = None, "no driver-branch package given (a snapshot's packages carry their branch)"
    elif repo_all:
        source, why = "repository", "the repository offers every version"
    elif kit_state["verified"]:
        source = "kit"
        why = "the repository does not offer %s; every kit file has its recorded sha256" % ", ".join(
            apt_spec(r) for r in rows if not r["repository"])
    else:
        source = None
        lost = [apt_spec(r) for r in rows if not r["repository"]]
        why = "the repository does not offer %s%s; %s" % (
            ", ".join(lost), (" (%s)" % policy_problem) if policy_problem else "",
            "the kit fails its check: " + "; ".join(kit_state["problems"]) if kit_state["recorded"]
            else "no rollback kit was recorded for this change")
    return {"packages": rows, "repository": repo_all, "kit": kit_state, "source": source, "why": why}
