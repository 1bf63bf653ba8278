"""The evidence package: one ``.tar.gz`` per decision, and its verification.

Layout inside the archive (every name relative, under one top directory)::

    <decision-id>/PACKAGE.json            sha256 + size of every other member, tool version, command
                                          lines, target file, operators, reviewer, outcome, signer
    <decision-id>/PACKAGE.json.sig        the OpenSSH signature over PACKAGE.json's bytes (signed
                                          packages; k3fleet.decide.signing)
    <decision-id>/decision/...            the decision's run directory
    <decision-id>/runs/<run>/...          every run the decision used, as verified

Writing never follows a symlink out of a run directory and stores regular files only; the
archive is written to a temporary file beside its destination, fsync'd, then renamed.
Reading refuses members that are links, devices, absolute or that climb out with ``..``
(docs/decision.md "The evidence package").

The signature lives inside the archive, beside what it signs, so one file is shipped and
archived; it cannot be listed in the manifest it signs, and is the one member that is not.
Matching its manifest proves only that the archive is undamaged: anyone can rewrite a member and
PACKAGE.json together. Who wrote it is proved by the signature alone (:func:`verify_package` with
an allowed-signers file), so an unsigned package is never reported as trusted.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from k3fleet import __version__
from k3fleet.bounds import loads_json, open_tar
from k3fleet.contracts import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK
from k3fleet.decide.signing import verify_signature
from k3fleet.errors import IncompleteError, UsageError
from k3fleet.evidence import is_secret_name, layout, redact
from k3fleet.evidence.layout import PACKAGE_MANIFEST, PACKAGE_SIGNATURE
from k3fleet.evidence.reader import RunReader
from k3fleet.evidence.verify import manifest_entries, verify_run
from k3fleet.evidence.writer import FILE_MODE, write_output

if TYPE_CHECKING:
    from k3fleet.decide.signing import SignatureCheck, SigningKey

PACKAGE_FORMAT = "k3fleet-evidence-1"
# A secret shorter than this is too likely to occur by chance ("true", "1").
_MIN_SECRET_LEN = 8


@dataclass
class PackageEntry:
    arcname: str  # relative to the package root
    source: Path


def _run_files(root: Path, label: str) -> Iterator[tuple[str, Path]]:
    """Regular files of a run directory; a symlink must resolve to a file inside the run itself."""
    base = root.resolve()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            target = p.resolve()
            if not target.is_relative_to(base) or not target.is_file():
                raise IncompleteError(f"run {label}: {rel} is a symlink out of the run directory: not packaged")
            yield rel, target
        elif p.is_file():
            yield rel, p
        elif not p.is_dir():
            raise IncompleteError(f"run {label}: {rel} is not a regular file: not packaged")


def secret_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Values of secret-named variables in the environment, long enough to search for."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if is_secret_name(k) and len(v) >= _MIN_SECRET_LEN}


def _scan(data: bytes, secrets: Mapping[str, str]) -> str | None:
    for name, value in secrets.items():
        if value.encode() in data:
            return name
    return None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_member_name(name: str, what: str) -> str:
    """``name`` if it can name a directory inside an evidence package (letters, digits, ``.``, ``_``, ``-``;
    not starting with a dot or a dash), else one usage line: ``decide`` calls this before its run directory
    exists, so a hostile label (newline, escapes, markup, ``-rf``, spaces) leaves nothing behind."""
    if not _PLAIN_NAME.match(name):
        raise UsageError(f"{what} {name!r} is not a plain directory name (letters, digits, '.', '_', '-'): "
                         "rename it before packaging")
    return name


def write_package(dest: Path, root_name: str, decision_dir: Path, runs: Sequence[tuple[str, Path]],
                  meta: Mapping[str, Any], *, mtime: _dt.datetime,
                  environ: Mapping[str, str] | None = None, sign: SigningKey | None = None,
                  force: bool = False, inputs: Sequence[Path] = ()) -> dict[str, Any]:
    """Write the archive; returns the package manifest. Refuses a file carrying a secret's value.

    With ``sign`` the manifest names the key and the signature over its bytes is a member; it is
    made before the archive is opened, so a key that cannot sign leaves no archive behind."""
    check_member_name(root_name, "package name")
    entries: list[PackageEntry] = [PackageEntry(layout.package_member(rel), p)
                                   for rel, p in _run_files(decision_dir, layout.PACKAGE_DECISION)]
    labels: set[str] = set()
    for label, path in runs:
        if label in labels:
            raise UsageError(f"run label {label!r} is repeated")
        check_member_name(label, "run label")
        labels.add(label)
        entries += [PackageEntry(f"{layout.PACKAGE_RUNS}/{label}/{rel}", p) for rel, p in _run_files(path, label)]
    secrets = secret_values(environ)
    files: list[dict[str, Any]] = []
    blobs: list[tuple[str, bytes]] = []
    for e in entries:
        data = e.source.read_bytes()
        hit = _scan(data, secrets)
        if hit is not None:
            raise IncompleteError(f"{e.arcname} contains the value of ${hit}: redact the run before packaging it")
        files.append({"path": e.arcname, "sha256": sha256_bytes(data), "bytes": len(data)})
        blobs.append((e.arcname, data))
    # What is packed is what was read just now: a run file changed after decide verified the run (while it
    # ran) no longer matches that run's own manifest, and is refused here rather than signed.
    mismatched = run_mismatches({f["path"]: f["sha256"] for f in files}, dict(blobs), require=False)
    if mismatched:
        raise IncompleteError(f"{mismatched[0]}: a run changed while decide read it; decide again"
                              + (f" ({len(mismatched) - 1} more)" if len(mismatched) > 1 else ""))
    # PACKAGE.json goes through the one redactor like every written file: the profile's name and rate
    # limits, --owner and --rollback-owner are free text an operator may paste a secret into. The
    # member list (paths and digests) is the package's own and follows unchanged.
    manifest = {"format": PACKAGE_FORMAT, "k3fleet_version": __version__, **redact(dict(meta)),
                "signer": sign.record() if sign is not None else None, "files": files}
    manifest_bytes = (json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n").encode()
    hit = _scan(manifest_bytes, secrets)
    if hit is not None:
        raise IncompleteError(f"{PACKAGE_MANIFEST} would contain the value of ${hit}: not packaged")
    blobs.insert(0, (PACKAGE_MANIFEST, manifest_bytes))
    if sign is not None:
        blobs.insert(1, (PACKAGE_SIGNATURE, sign.sign(manifest_bytes)))
    ts = int(mtime.timestamp())

    def fill(raw: IO[bytes]) -> None:
        # mtime=0 in the gzip header: the same content gives the same archive bytes.
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for arcname, data in blobs:
                info = tarfile.TarInfo(f"{root_name}/{arcname}")
                info.size = len(data)
                info.mtime = ts
                info.mode = FILE_MODE  # evidence: its owner's only, extracted or not
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))

    # The one writer: never through a link or device, never over a file without --force, never
    # inside a run it packages; temp file + fsync + rename, one line on any failure.
    write_output(dest, fill, "--archive", force=force, inputs=inputs, mode=FILE_MODE)
    return manifest


# -- verification -------------------------------------------------------------------------------------


# What a package's signature says (PackageCheck.signature).
UNSIGNED, UNCHECKED, VERIFIED, FAILED = "unsigned", "unchecked", "verified", "failed"


@dataclass
class PackageCheck:
    archive: Path
    root: str | None = None
    manifest: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    checked: int = 0
    signature: str = UNSIGNED  # unsigned | unchecked (no allowed-signers given) | verified | failed
    signer: SignatureCheck | None = None
    signature_problem: str | None = None
    # Why this approval is no longer the one to act on (a later decision in the same runs tree, or older
    # than --max-age); check_fresh fills it.
    stale: str | None = None
    # Every member's bytes as verified (verify_package(keep=True)): the copy a caller then uses, so what was
    # checked is what is used even when the archive on disk is swapped after the check.
    members: dict[str, bytes] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every member matches PACKAGE.json: the archive is undamaged (not: trustworthy)."""
        return not self.problems

    @property
    def trusted(self) -> bool:
        """Undamaged, and PACKAGE.json signed by a principal of the allowed-signers file."""
        return self.ok and self.signature == VERIFIED

    @property
    def claimed_signer(self) -> dict[str, Any] | None:
        claimed = self.manifest.get("signer") if isinstance(self.manifest, dict) else None
        return claimed if isinstance(claimed, dict) and claimed else None

    @property
    def exit_code(self) -> int:
        """1 when the signature fails (1 wins over 3), 3 when damaged, unsigned or not checked, else 0."""
        if self.signature == FAILED or (self.stale is not None and self.trusted):
            return EXIT_FAILED
        return EXIT_OK if self.trusted else EXIT_INCOMPLETE

    @property
    def reviewer(self) -> str | None:
        value = self.manifest.get("reviewer") if isinstance(self.manifest, dict) else None
        return value if isinstance(value, str) and value.strip() else None

    @property
    def reviewed_at(self) -> _dt.datetime | None:
        return aware_time(self.manifest.get("reviewed_at") if isinstance(self.manifest, dict) else None)


def _unsafe(name: str) -> str | None:
    p = PurePosixPath(name)
    if name.startswith("/") or p.is_absolute():
        return "absolute path"
    if ".." in p.parts:
        return "path climbs out with '..'"
    if "\\" in name or "\x00" in name:
        return "unusual characters in the name"
    return None


def verify_package(archive: Path, allowed_signers: Path | None = None, *, keep: bool = False) -> PackageCheck:
    """Check every member against PACKAGE.json: changed, missing and extra files, unsafe members, every run
    against its own manifest; then the signature over PACKAGE.json against ``allowed_signers`` (``unchecked``
    without one) and the reviewer it names. With ``keep`` the members' bytes stay in ``members``: the one
    read of the archive, for a caller that uses what it verified (``watch``)."""
    res = PackageCheck(archive=archive)
    if not archive.is_file():
        raise UsageError(f"{archive} is not a file")
    if allowed_signers is not None and not allowed_signers.is_file():
        raise UsageError(f"--allowed-signers {allowed_signers} is not a file")
    digests: dict[str, str] = {}
    raw: dict[str, bytes] = {}
    current: str | None = None
    try:
        # Streamed under the package caps (k3fleet.bounds): a gzip bomb stops at the cap, not in memory.
        with open_tar(archive) as tar:
            while True:
                try:
                    member = tar.next()
                except tarfile.ReadError as exc:
                    res.problems.append(f"{_after(current)}: archive unreadable from here ({exc})")
                    break
                if member is None:
                    break
                current = member.name
                why = _unsafe(member.name)
                if why is not None:
                    res.problems.append(f"{member.name}: refused: {why}")
                    continue
                if not member.isfile():
                    kind = "link" if member.issym() or member.islnk() else "directory" if member.isdir() else "special"
                    if member.isdir():
                        continue
                    res.problems.append(f"{member.name}: refused: a {kind} member")
                    continue
                top, _, rel = member.name.partition("/")
                if res.root is None:
                    res.root = top
                if top != res.root or not rel:
                    res.problems.append(f"{member.name}: outside the package directory {res.root}/")
                    continue
                fh = tar.extractfile(member)
                if fh is None:
                    res.problems.append(f"{rel}: unreadable member")
                    continue
                try:
                    data = fh.read()
                except (OSError, EOFError, tarfile.TarError, gzip.BadGzipFile) as exc:
                    res.problems.append(f"{rel}: unreadable: the archive is damaged inside this file ({exc})")
                    break
                if rel in digests:
                    res.problems.append(f"{rel}: appears twice in the archive")
                digests[rel] = sha256_bytes(data)
                if keep:
                    res.members[rel] = data
                if rel in (PACKAGE_MANIFEST, PACKAGE_SIGNATURE) or rel.endswith("/" + layout.MANIFEST):
                    raw[rel] = data
                if rel == PACKAGE_MANIFEST:
                    try:
                        res.manifest = loads_json(data.decode("utf-8"))
                    except (UnicodeDecodeError, ValueError) as exc:
                        res.problems.append(f"{PACKAGE_MANIFEST}: not valid JSON ({exc})")
    except (tarfile.TarError, OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        res.problems.append(f"{_after(current)}: archive unreadable ({exc})")
    _compare(res, digests)
    if res.manifest is not None and not res.problems:
        # Every run inside (and the decision itself) against its own manifest: a file changed while decide
        # read it is listed in PACKAGE.json with its new digest, but its run's manifest still says the old.
        res.problems += run_mismatches(digests, raw)
    _check_signature(res, raw.get(PACKAGE_MANIFEST), raw.get(PACKAGE_SIGNATURE), allowed_signers)
    return res


def _run_roots(paths: Iterator[str] | Sequence[str]) -> set[str]:
    """The run directories inside a package: ``decision/`` and each ``runs/<label>/``."""
    roots: set[str] = set()
    for rel in paths:
        parts = rel.split("/")
        if parts[0] == layout.PACKAGE_DECISION and len(parts) > 1:
            roots.add(layout.PACKAGE_DECISION + "/")
        elif parts[0] == layout.PACKAGE_RUNS and len(parts) > 2:
            roots.add(f"{parts[0]}/{parts[1]}/")
    return roots


def run_mismatches(digests: Mapping[str, str], blobs: Mapping[str, bytes], *, require: bool = True) -> list[str]:
    """Each packaged run (and the decision) checked against its own ``manifest.json``: a file whose digest
    differs from what its run's manifest lists, one it lists that is not packaged, one it does not list.
    ``require``: a run without a manifest is a problem (reading a package; decide verified its runs)."""
    problems: list[str] = []
    for root in sorted(_run_roots(list(digests))):
        label = root.rstrip("/")
        raw = blobs.get(root + layout.MANIFEST)
        if raw is None:
            if require:
                problems.append(f"{label}: no {layout.MANIFEST}: not a finished run")
            continue
        try:
            entries = manifest_entries(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, ValueError, RecursionError):
            entries = None
        if entries is None:
            problems.append(f"{label}/{layout.MANIFEST}: not a k3fleet run manifest")
            continue
        listed = dict(entries)
        for rel, digest in sorted(listed.items()):
            have = digests.get(root + rel)
            if have is None:
                problems.append(f"{label}/{rel}: listed in the run's own manifest, not in the package")
            elif have != digest:
                problems.append(f"{label}/{rel}: does not match the run's own manifest (changed after the run "
                                f"was written: sha256 {have[:16]}..., run manifest {digest[:16]}...)")
        for rel in sorted(digests):
            if rel.startswith(root) and rel != root + layout.MANIFEST and rel[len(root):] not in listed:
                problems.append(f"{rel}: not in the run's own manifest")
    return problems


def aware_time(value: object) -> _dt.datetime | None:
    """An ISO-8601 time as written in run files ('Z' or an offset; none: UTC); None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        when = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=_dt.UTC)


def later_decisions(trees: Sequence[Path], check: PackageCheck) -> list[tuple[str, _dt.datetime, str]]:
    """Decisions in the runs trees ``trees`` taken after the package's: (run id, time, outcome), newest first.

    A decision counts when it is a decision run directory that matches its own manifest (so a half-written
    or tampered directory cannot pose as one) and names a time after the package's ``reviewed_at``."""
    own = check.reviewed_at
    if own is None:
        return []
    found: dict[str, tuple[str, _dt.datetime, str]] = {}
    for tree in trees:
        try:
            entries = sorted(tree.iterdir())
        except OSError:
            continue
        for p in entries:
            if p.name == check.root or p.is_symlink() or not (p / layout.DECISION).is_file():
                continue
            try:
                reader = RunReader(p)
                if reader.kind != "decision" or not verify_run(p).ok:
                    continue
                decision = reader.object(layout.DECISION)
            except (OSError, UsageError, IncompleteError):
                continue
            when = aware_time(decision.get("reviewed_at"))
            if when is not None and when > own:
                found[os.path.realpath(p)] = (p.name, when, str(decision.get("outcome", "?")))
    return sorted(found.values(), key=lambda x: x[1], reverse=True)


def check_fresh(check: PackageCheck, trees: Sequence[Path], max_age_s: float | None,
                now: _dt.datetime | None = None) -> str | None:
    """Why the package's approval is not the one to act on, one line; None when it still stands.

    A replayed older approval is refused: a later decision in the same runs tree supersedes it (whatever
    that decision's outcome), and ``--max-age`` bounds how old an approval may be."""
    when = check.reviewed_at
    if when is None:
        check.stale = f"{PACKAGE_MANIFEST} names no decision time: cannot tell whether a later decision replaced it"
        return check.stale
    later = later_decisions(trees, check)
    if later:
        name, at, outcome = later[0]
        check.stale = (f"approved {when.isoformat()}, but a later decision {name} ({outcome}, "
                       f"{at.isoformat()}) in the same runs tree replaces it")
        return check.stale
    if max_age_s is not None:
        age = ((now or _dt.datetime.now(_dt.UTC)) - when).total_seconds()
        if age > max_age_s:
            check.stale = (f"approved {when.isoformat()}, {age / 86400:.1f} days ago: older than --max-age "
                           f"({max_age_s / 86400:g} days)")
            return check.stale
    return None


def _check_signature(res: PackageCheck, signed: bytes | None, signature: bytes | None,
                     allowed_signers: Path | None) -> None:
    claimed = res.claimed_signer
    if signature is None:
        if claimed is not None:
            res.signature = FAILED
            res.signature_problem = (f"{PACKAGE_MANIFEST} names signer key {claimed.get('key_fingerprint')}, but "
                                     f"{PACKAGE_SIGNATURE} is missing: the signature was removed")
        return
    if signed is None:
        res.signature = FAILED
        res.signature_problem = f"{PACKAGE_SIGNATURE} is there but {PACKAGE_MANIFEST} is not: nothing it signs"
        return
    if allowed_signers is None:
        res.signature = UNCHECKED
        return

    check = verify_signature(signed, signature, allowed_signers, reviewer=res.reviewer)
    res.signer = check
    if not check.verified:
        res.signature, res.signature_problem = FAILED, check.reason
    elif res.reviewer is None:
        res.signature = FAILED
        res.signature_problem = f"{PACKAGE_MANIFEST} names no reviewer: a signature must bind the reviewer it names"
    elif not check.bound:
        res.signature = FAILED
        res.signature_problem = (f"signed by {check.principal}, but the decision names reviewer {res.reviewer}: "
                                 f"{allowed_signers} grants that key to no principal for the reviewer")
    elif claimed is None or claimed.get("key_fingerprint") != check.fingerprint:
        named = claimed.get("key_fingerprint") if claimed is not None else "no signer"
        res.signature = FAILED
        res.signature_problem = f"{PACKAGE_MANIFEST} names {named}, but the signature is by {check.fingerprint}"
    else:
        res.signature = VERIFIED


def _after(name: str | None) -> str:
    return f"after {name}" if name else "the archive's start"


def _compare(res: PackageCheck, digests: dict[str, str]) -> None:
    if res.manifest is None:
        if not any(p.startswith(PACKAGE_MANIFEST) for p in res.problems):
            res.problems.append(f"{PACKAGE_MANIFEST}: missing (not a k3fleet evidence package)")
        return
    files = res.manifest.get("files") if isinstance(res.manifest, dict) else None
    if not isinstance(files, list) or res.manifest.get("format") != PACKAGE_FORMAT:
        res.problems.append(f"{PACKAGE_MANIFEST}: not a {PACKAGE_FORMAT} manifest")
        return
    named = res.manifest.get("decision_id")
    if isinstance(named, str) and res.root is not None and named != res.root:
        res.problems.append(f"{res.root}/: the package directory is not the decision {PACKAGE_MANIFEST} names "
                            f"({named})")
    listed: dict[str, str] = {}
    for f in files:
        if isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("sha256"), str):
            listed[f["path"]] = f["sha256"]
    for rel, digest in sorted(listed.items()):
        if rel not in digests:
            res.problems.append(f"{rel}: missing from the archive")
        elif digests[rel] != digest:
            res.problems.append(f"{rel}: changed (sha256 {digests[rel][:16]}..., manifest {digest[:16]}...)")
        else:
            res.checked += 1
    # The signature cannot be listed in the manifest it signs; it is checked on its own.
    for rel in sorted(set(digests) - set(listed) - {PACKAGE_MANIFEST, PACKAGE_SIGNATURE}):
        res.problems.append(f"{rel}: not in {PACKAGE_MANIFEST}")


def read_package_file(archive: Path, rel: str) -> bytes:
    """One member's bytes from a verified package (the caller verifies first)."""
    if _unsafe(rel) is not None:
        raise UsageError(f"{rel}: not a package path")
    with open_tar(archive) as tar:
        for member in tar:
            name = member.name.partition("/")[2]
            if name == rel and member.isfile() and _unsafe(member.name) is None:
                fh = tar.extractfile(member)
                if fh is not None:
                    return fh.read()
    raise UsageError(f"{archive}: has no {rel}")
