"""Signatures that bind who approved what and when (docs/decision.md "Signing and verification").

- a package carol approved, changed and signed again by erin (also an allowed signer), fails: the signer must
  be the reviewer PACKAGE.json names, or a principal the allowed-signers file grants for that reviewer;
- a run inside the package that no longer matches its own manifest (its verdict.json changed while decide
  read it) fails verification, and decide refuses to package such a run;
- an older genuine approval is refused after a later decision in the same runs tree, or past --max-age.

Every package is written by the real ``k3fleet decide`` and signed by the real ``ssh-keygen -Y sign``.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from decide_helpers import EvidenceKeys, k3fleet, read_members, rewrite_package, signed_unapproved, write_members

from k3fleet.decide.package import verify_package

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def signed(healthy_audit: Path, evidence_keys: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """carol's signed decision over the healthy audit (evidence missing: exit 3), its package beside it."""
    out = signed_unapproved(healthy_audit, evidence_keys.key, tmp_path_factory.mktemp("bind") / "decision")
    return out.with_name(out.name + ".tar.gz")


@pytest.fixture(scope="module")
def erin(evidence_keys: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another allowed signer's key (erin@example.org), in an allowed-signers file beside carol's."""
    root = tmp_path_factory.mktemp("erin")
    key = EvidenceKeys._keygen(root / "erin")
    (root / "allowed_signers").write_text(evidence_keys.allowed.read_text()
                                          + EvidenceKeys.allowed_line(key, principal="erin@example.org"))
    return key


def _root(members: dict[str, bytes]) -> str:
    return next(iter(members)).split("/", 1)[0]


def _other_image(members: dict[str, bytes]) -> dict[str, bytes]:
    """The attack's edit: the decision's target image swapped (its decision.json), as a new baseline would be."""
    name = f"{_root(members)}/decision/decision.json"
    decision = json.loads(members[name])
    decision.setdefault("warnings", []).append("image: registry.example.org/other@sha256:" + "e" * 64)
    return {"decision/decision.json": json.dumps(decision, indent=2).encode()}


def _verify(archive: Path, allowed: Path, *extra: str) -> Any:
    return k3fleet("verify-evidence", str(archive), "--allowed-signers", str(allowed), *extra)


def test_resigned_by_another_allowed_signer_fails_naming_the_reviewer(signed: Path, erin: Path, evidence_keys: Any,
                                                                      tmp_path: Path) -> None:
    members = read_members(signed)
    allowed = erin.parent / "allowed_signers"
    by_erin = tmp_path / "by-erin.tar.gz"
    write_members(by_erin, rewrite_package(members, _other_image(members), key=erin, tmp=tmp_path))
    assert verify_package(by_erin).ok  # consistent: every member and every run manifest match
    proc = _verify(by_erin, allowed)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "signed by erin@example.org, but the decision names reviewer carol" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "intact" not in proc.stdout
    # The same rewrite signed by carol herself is hers to make: it verifies and says who approved what, when.
    by_carol = tmp_path / "by-carol.tar.gz"
    write_members(by_carol, rewrite_package(members, _other_image(members), key=evidence_keys.key, tmp=tmp_path))
    ok = _verify(by_carol, allowed)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    package = json.loads(read_members(by_carol)[f"{_root(members)}/PACKAGE.json"])
    assert (f"decided by carol at {package['reviewed_at']}: {package['decision']['outcome']} "
            f"(decision {_root(members)})") in ok.stdout
    report = json.loads(_verify(by_carol, allowed, "--json").stdout)
    assert report["reviewer"] == "carol" and report["reviewed_at"] == package["reviewed_at"]


def test_a_principal_the_file_grants_for_the_reviewer_may_sign(signed: Path, erin: Path, tmp_path: Path) -> None:
    """erin's key listed for the principal pattern ``carol*`` signs for carol (ssh-keygen -Y verify -I carol)."""
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(EvidenceKeys.allowed_line(erin, principal="carol*"))
    members = read_members(signed)
    archive = tmp_path / "granted.tar.gz"
    write_members(archive, rewrite_package(members, {}, key=erin, tmp=tmp_path))
    proc = _verify(archive, allowed)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "signed by carol " in proc.stdout


def test_a_run_changed_while_decide_read_it_fails_verification(signed: Path, evidence_keys: Any,
                                                               tmp_path: Path) -> None:
    """decide verified the audit, then its verdict.json changed before it was packed: PACKAGE.json lists the new
    bytes (and is signed), the audit's own manifest still lists the old ones."""
    members = read_members(signed)
    label = next(n.split("/")[2] for n in members if "/runs/" in n and n.endswith("/verdict.json"))
    rel = f"runs/{label}/verdict.json"
    verdict = json.loads(members[f"{_root(members)}/{rel}"])
    verdict["exit_code"] = 0
    raced = rewrite_package(members, {rel: json.dumps(verdict).encode()}, run_manifests=False,
                            key=evidence_keys.key, tmp=tmp_path)
    archive = tmp_path / "raced.tar.gz"
    write_members(archive, raced)
    proc = _verify(archive, evidence_keys.allowed)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"DIFFERENT  {rel}: does not match the run's own manifest" in proc.stdout
    assert "intact:" not in proc.stdout


def test_decide_refuses_to_package_a_run_that_no_longer_matches_its_manifest(healthy_audit: Path,
                                                                             tmp_path: Path) -> None:
    """The race at the moment of packing: the bytes decide packs are checked against the run's own manifest."""
    from k3fleet.decide.package import write_package
    from k3fleet.errors import IncompleteError

    run = tmp_path / "audit"
    shutil.copytree(healthy_audit, run)
    decision = tmp_path / "decision"
    decision.mkdir()
    (decision / "manifest.json").write_text(json.dumps({"files": []}))
    (run / "verdict.json").write_text((run / "verdict.json").read_text().replace('"exit_code"', '"exit_code" ', 1))
    changed = re.escape("runs/audit/verdict.json: does not match the run's own manifest")
    with pytest.raises(IncompleteError, match=changed):
        write_package(tmp_path / "p.tar.gz", "decision", decision, [("audit", run)], {"reviewer": "carol"},
                      mtime=_dt.datetime.now(_dt.UTC))
    assert not (tmp_path / "p.tar.gz").exists()


def _next_second() -> None:
    """Decision times are whole seconds: the next decision is later only once the second has turned."""
    time.sleep(1.05 - (time.time() % 1.0))


def test_an_older_approval_is_refused_after_a_later_decision_or_past_max_age(signed: Path, healthy_audit: Path,
                                                                             evidence_keys: Any,
                                                                             tmp_path: Path) -> None:
    tree = tmp_path / "runs"
    tree.mkdir()
    older = tree / signed.name
    shutil.copy2(signed, older)
    assert _verify(older, evidence_keys.allowed).returncode == 0
    assert verify_package(older).ok
    _next_second()
    later = k3fleet("decide", str(healthy_audit), "--reviewer", "dave", "--out", str(tree / "later"))
    assert later.returncode == 3, later.stderr[-2000:]
    proc = _verify(older, evidence_keys.allowed)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "a later decision later (" in line and "replaces it" in line
    # Another tree holds no later decision; --max-age still bounds how old the approval may be.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _verify(older, evidence_keys.allowed, "--runs-dir", str(elsewhere)).returncode == 0
    _next_second()
    aged = _verify(older, evidence_keys.allowed, "--runs-dir", str(elsewhere), "--max-age", "1s")
    assert aged.returncode == 1 and "older than --max-age" in aged.stderr, aged.stdout + aged.stderr
    bad = _verify(older, evidence_keys.allowed, "--max-age", "inf")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_the_package_directory_is_the_decision_the_statement_names(signed: Path, evidence_keys: Any,
                                                                   tmp_path: Path) -> None:
    """The decision's id is in the signed statement: an archive whose top directory was renamed (to pass
    for another decision) is not intact."""
    members = read_members(signed)
    root = _root(members)
    renamed = tmp_path / "renamed.tar.gz"
    write_members(renamed, {f"other-decision/{n.split('/', 1)[1]}": v for n, v in members.items()})
    proc = _verify(renamed, evidence_keys.allowed)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"other-decision/: the package directory is not the decision PACKAGE.json names ({root})" in proc.stdout
