"""The evidence package from real runs: written safely, signed with a real OpenSSH key, verified later,
tampering named file by file, and a package rewritten consistently (content and PACKAGE.json) never
called intact."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from decide_helpers import PASSPHRASE, SIGNER, k3fleet

from k3fleet.decide.package import PACKAGE_MANIFEST, PACKAGE_SIGNATURE, verify_package, write_package

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def decision(healthy_audit: Path, evidence_keys: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("pkg") / "decision"
    proc = k3fleet("decide", str(healthy_audit), "--reviewer", "carol", "--out", str(out), "--json",
                   "--sign-key", str(evidence_keys.key))
    assert proc.returncode == 3, proc.stderr[-2000:]  # no acceptance run: evidence missing
    assert f"signed: ED25519 key {evidence_keys.fingerprint}" in proc.stderr
    archive = out.with_name(out.name + ".tar.gz")
    assert archive.is_file()
    return out, archive


@pytest.fixture(scope="module")
def unsigned(healthy_audit: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("unsigned") / "decision"
    proc = k3fleet("decide", str(healthy_audit), "--reviewer", "carol", "--out", str(out))
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "unsigned" in proc.stderr
    return out.with_name(out.name + ".tar.gz")


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def _write(archive: Path, members: dict[str, bytes], extra: list[tarfile.TarInfo] | None = None) -> None:
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info)


def test_package_holds_the_runs_the_checklist_the_decision_and_a_full_manifest(
        decision: tuple[Path, Path], healthy_audit: Path) -> None:
    out, archive = decision
    members = _members(archive)
    root = out.name
    assert all(name.startswith(f"{root}/") and ".." not in name for name in members)
    manifest = json.loads(members[f"{root}/{PACKAGE_MANIFEST}"])
    listed = {f["path"] for f in manifest["files"]}
    # Every member but the manifest and the signature over it is listed, with its sha256.
    assert listed == {n.removeprefix(f"{root}/") for n in members} - {PACKAGE_MANIFEST, PACKAGE_SIGNATURE}
    for rel in ("decision/decision.json", "decision/checklist.json", "decision/summary.json", "decision/report.md",
                "decision/manifest.json", "decision/command.json", f"runs/{healthy_audit.name}/verdict.json",
                f"runs/{healthy_audit.name}/manifest.json", f"runs/{healthy_audit.name}/inputs/target.json"):
        assert rel in listed, rel
    assert manifest["reviewer"] == "carol" and manifest["reviewed_at"]
    assert manifest["k3fleet_version"] and manifest["operators"]
    assert manifest["target"]["file"] == f"{healthy_audit.name}/inputs/target.json"
    assert manifest["runs"][0]["argv"][1:3] == ["audit", "--lab"]
    assert manifest["command"][1] == "decide"
    assert manifest["decision"] == {"outcome": "observe_with_limits", "approved": False, "exit_code": 3,
                                    "track": "official"}
    # Nothing in it is a link or a device, every member is its owner's only (evidence privacy); every size matches.
    assert archive.stat().st_mode & 0o777 == 0o600
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar:
            assert m.isfile() and m.mode == 0o600 and m.uid == 0
    assert members[f"{root}/{PACKAGE_SIGNATURE}"].startswith(b"-----BEGIN SSH SIGNATURE-----")


def test_signed_intact_package_passes_and_names_its_signer(decision: tuple[Path, Path], evidence_keys: Any) -> None:
    _, archive = decision
    manifest = json.loads(next(v for k, v in _members(archive).items() if k.endswith(f"/{PACKAGE_MANIFEST}")))
    assert manifest["signer"] == {"key_fingerprint": evidence_keys.fingerprint, "key_type": "ED25519",
                                  "namespace": "k3fleet-evidence", "format": "sshsig"}
    ok = k3fleet("verify-evidence", str(archive), "--allowed-signers", str(evidence_keys.allowed))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"intact: {len(manifest['files'])} files match" in ok.stdout
    assert f"signed by {SIGNER} (ED25519 key {evidence_keys.fingerprint}), namespace k3fleet-evidence" in ok.stdout
    assert f"sha256 {hashlib.sha256(archive.read_bytes()).hexdigest()}" in ok.stdout
    report = json.loads(k3fleet("verify-evidence", str(archive), "--allowed-signers", str(evidence_keys.allowed),
                                "--json").stdout)
    assert report["ok"] and report["exit_code"] == 0
    assert report["signature"]["status"] == "verified" and report["signature"]["principal"] == SIGNER
    assert report["signature"]["key_fingerprint"] == evidence_keys.fingerprint
    # Without an allowed-signers file nothing says who signed: matching files alone are not "intact".
    unchecked = k3fleet("verify-evidence", str(archive))
    assert unchecked.returncode == 3 and "intact" not in unchecked.stdout
    assert "signature not checked: give --allowed-signers FILE" in unchecked.stderr


def test_unsigned_package_is_reported_unsigned_never_intact(unsigned: Path, evidence_keys: Any) -> None:
    proc = k3fleet("verify-evidence", str(unsigned), "--allowed-signers", str(evidence_keys.allowed))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "intact" not in proc.stdout and "unsigned:" in proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1 and "unsigned" in proc.stderr
    manifest = json.loads(next(v for k, v in _members(unsigned).items() if k.endswith(f"/{PACKAGE_MANIFEST}")))
    assert manifest["signer"] is None


def _forge_go_live(members: dict[str, bytes], *, signer: Any = "keep") -> dict[str, bytes]:
    """The attack: decision.json turned into an approved go_live, PACKAGE.json rewritten to match it."""
    out = dict(members)
    root = next(iter(out)).split("/", 1)[0]
    name = f"{root}/decision/decision.json"
    decision = json.loads(out[name])
    assert decision["approved"] is False
    decision.update(outcome="go_live", approved=True, exit_code=0)
    out[name] = json.dumps(decision, indent=2).encode()
    manifest = json.loads(out[f"{root}/{PACKAGE_MANIFEST}"])
    for f in manifest["files"]:
        if f["path"] == "decision/decision.json":
            f["sha256"], f["bytes"] = hashlib.sha256(out[name]).hexdigest(), len(out[name])
    manifest["decision"].update(outcome="go_live", approved=True, exit_code=0)
    if signer != "keep":
        manifest["signer"] = signer
    out[f"{root}/{PACKAGE_MANIFEST}"] = (json.dumps(manifest, indent=2) + "\n").encode()
    return out


def _sshsig(key: Path, data: bytes, tmp: Path) -> bytes:
    msg = tmp / "forged-manifest"
    msg.write_bytes(data)
    subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", "k3fleet-evidence", str(msg)], check=True,
                   capture_output=True, stdin=subprocess.DEVNULL, timeout=60)
    return msg.with_name(msg.name + ".sig").read_bytes()


@pytest.mark.parametrize("attack, code, words", [
    # Unsigned package, content and PACKAGE.json rewritten together: every file matches, still unsigned.
    ("unsigned_forged", 3, "unsigned"),
    # Signed package rewritten the same way, its signature kept: it no longer signs these bytes.
    ("signed_forged", 1, "the signature does not match PACKAGE.json"),
    # ... and the signature dropped: PACKAGE.json still names its signer.
    ("signature_removed", 1, "the signature was removed"),
    # ... the signature dropped and the signer erased: now it is just unsigned.
    ("signer_erased", 3, "unsigned"),
    # ... and signed again by a key nobody allowed.
    ("resigned_by_stranger", 1, "which is not in"),
])
def test_forged_package_is_never_intact(decision: tuple[Path, Path], unsigned: Path, evidence_keys: Any,
                                        tmp_path: Path, attack: str, code: int, words: str) -> None:
    _, archive = decision
    members = _members(unsigned if attack == "unsigned_forged" else archive)
    root = next(iter(members)).split("/", 1)[0]
    sig = f"{root}/{PACKAGE_SIGNATURE}"
    if attack == "unsigned_forged":
        forged = _forge_go_live(members)
    elif attack == "signed_forged":
        forged = _forge_go_live(members)
        assert sig in forged
    elif attack == "signature_removed":
        forged = _forge_go_live(members)
        del forged[sig]
    elif attack == "signer_erased":
        forged = _forge_go_live(members, signer=None)
        del forged[sig]
    else:
        forged = _forge_go_live(members, signer={"key_fingerprint": evidence_keys.stranger_fingerprint,
                                                 "key_type": "ED25519", "namespace": "k3fleet-evidence",
                                                 "format": "sshsig"})
        forged[sig] = _sshsig(evidence_keys.stranger, forged[f"{root}/{PACKAGE_MANIFEST}"], tmp_path)
    bad = tmp_path / "forged.tar.gz"
    _write(bad, forged)
    # The forgery is consistent: no member differs from the rewritten manifest.
    assert verify_package(bad).ok
    proc = k3fleet("verify-evidence", str(bad), "--allowed-signers", str(evidence_keys.allowed))
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "intact" not in proc.stdout and "DIFFERENT" not in proc.stdout
    assert words in proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    if attack == "resigned_by_stranger":
        assert evidence_keys.stranger_fingerprint in proc.stderr


def test_signed_by_an_unknown_key_or_for_another_namespace_fails(healthy_audit: Path, decision: tuple[Path, Path],
                                                                evidence_keys: Any, tmp_path: Path) -> None:
    out = tmp_path / "by-stranger"
    made = k3fleet("decide", str(healthy_audit), "--reviewer", "carol", "--out", str(out), "--sign-key",
                   str(evidence_keys.stranger))
    assert made.returncode == 3, made.stderr
    proc = k3fleet("verify-evidence", str(out.with_name(out.name + ".tar.gz")), "--allowed-signers",
                   str(evidence_keys.allowed))
    assert proc.returncode == 1 and "intact" not in proc.stdout
    assert f"signed by ED25519 key {evidence_keys.stranger_fingerprint}, which is not in" in proc.stderr
    # The reviewer's key, allowed only for git signatures: not a signer of evidence.
    _, archive = decision
    proc = k3fleet("verify-evidence", str(archive), "--allowed-signers", str(evidence_keys.wrong_namespace))
    assert proc.returncode == 1 and "intact" not in proc.stdout
    assert "does not allow for k3fleet-evidence" in proc.stderr and "not permitted" in proc.stderr
    missing = k3fleet("verify-evidence", str(archive), "--allowed-signers", str(tmp_path / "nope"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("case", ["missing", "not_a_key", "directory", "unreadable", "encrypted_without_agent"])
def test_a_key_that_cannot_sign_is_one_line_exit_2_and_writes_nothing(healthy_audit: Path, evidence_keys: Any,
                                                                      tmp_path: Path, case: str) -> None:
    key = tmp_path / "key"
    if case == "not_a_key":
        key.write_text("this is not an OpenSSH key\n")
    elif case == "directory":
        key.mkdir()
    elif case == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads a file whatever its mode")
        shutil.copy(evidence_keys.key, key)
        key.chmod(0)
    elif case == "encrypted_without_agent":
        key = evidence_keys.encrypted
    out = tmp_path / "decision"
    proc = k3fleet("decide", str(healthy_audit), "--reviewer", "carol", "--out", str(out), "--sign-key", str(key),
                   env={"SSH_AUTH_SOCK": ""})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--sign-key" in lines[0] and "Traceback" not in proc.stderr, lines
    if case == "encrypted_without_agent":
        assert "ssh-agent" in lines[0]
    assert not out.exists() and not out.with_name(out.name + ".tar.gz").exists()
    assert not list(tmp_path.glob("*.tar.gz*"))


def test_an_encrypted_key_signs_through_ssh_agent(healthy_audit: Path, evidence_keys: Any, tmp_path: Path) -> None:
    if shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None:
        pytest.skip("ssh-agent / ssh-add not installed")
    sock = tmp_path / "agent.sock"
    askpass = tmp_path / "askpass.sh"
    askpass.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
    askpass.chmod(0o700)
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # a hang guard: the agent makes its socket at once
            if sock.exists() or agent.poll() is not None:
                break
            time.sleep(0.05)
        assert sock.exists(), "ssh-agent did not start"
        env = {"SSH_AUTH_SOCK": str(sock), "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force",
               "DISPLAY": ":0"}
        subprocess.run(["ssh-add", str(evidence_keys.encrypted)], check=True, capture_output=True, timeout=60,
                       env={**os.environ, **env}, stdin=subprocess.DEVNULL)
        out = tmp_path / "decision"
        proc = k3fleet("decide", str(healthy_audit), "--reviewer", "carol", "--out", str(out), "--sign-key",
                       str(evidence_keys.encrypted), env={"SSH_AUTH_SOCK": str(sock)})
        assert proc.returncode == 3, proc.stderr
        assert "signed: ED25519 key" in proc.stderr
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    allowed = tmp_path / "allowed"
    allowed.write_text(evidence_keys.allowed_line(evidence_keys.encrypted))
    ok = k3fleet("verify-evidence", str(out.with_name(out.name + ".tar.gz")), "--allowed-signers", str(allowed))
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_ssh_keygen_missing_is_one_line_exit_3(healthy_audit: Path, decision: tuple[Path, Path],
                                               evidence_keys: Any, tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    _, archive = decision
    proc = k3fleet("verify-evidence", str(archive), "--allowed-signers", str(evidence_keys.allowed),
                   env={"PATH": str(empty)})
    assert proc.returncode == 3 and "intact" not in proc.stdout
    assert proc.stderr.strip().splitlines() == [
        "k3fleet: error: ssh-keygen is not on PATH: install the OpenSSH client (openssh-client) to sign or "
        "verify evidence packages"]
    out = tmp_path / "decision"
    proc = k3fleet("decide", str(healthy_audit), "--reviewer", "carol", "--out", str(out), "--sign-key",
                   str(evidence_keys.key), env={"PATH": str(empty)})
    assert proc.returncode == 3 and "ssh-keygen is not on PATH" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists() and not out.with_name(out.name + ".tar.gz").exists()


def test_one_byte_changed_inside_a_file_is_named(decision: tuple[Path, Path], tmp_path: Path) -> None:
    _, archive = decision
    members = _members(archive)
    victim = next(n for n in members if n.endswith("/verdict.json"))
    data = bytearray(members[victim])
    data[len(data) // 2] ^= 0x01
    members[victim] = bytes(data)
    bad = tmp_path / "tampered.tar.gz"
    _write(bad, members)
    proc = k3fleet("verify-evidence", str(bad))
    assert proc.returncode == 3
    rel = victim.split("/", 1)[1]
    assert f"DIFFERENT  {rel}: changed" in proc.stdout
    assert "1 difference(s)" in proc.stderr and "Traceback" not in proc.stderr


def test_one_byte_flipped_in_the_compressed_archive_fails_naming_where(decision: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    _, archive = decision
    raw = bytearray(archive.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad = tmp_path / "flipped.tar.gz"
    bad.write_bytes(bytes(raw))
    proc = k3fleet("verify-evidence", str(bad))
    assert proc.returncode == 3, proc.stdout
    assert "Traceback" not in proc.stderr
    names = {n.split("/", 1)[1] for n in _members(archive)}
    flagged = [line for line in proc.stdout.splitlines() if line.startswith("DIFFERENT")]
    assert flagged and any(any(n in line for n in names) for line in flagged), flagged


def test_a_file_added_or_removed_is_named(decision: tuple[Path, Path], tmp_path: Path) -> None:
    _, archive = decision
    members = _members(archive)
    root = next(iter(members)).split("/", 1)[0]
    removed = next(n for n in members if n.endswith("checklist.json"))
    del members[removed]
    members[f"{root}/runs/extra.txt"] = b"planted\n"
    bad = tmp_path / "changed.tar.gz"
    _write(bad, members)
    res = verify_package(bad)
    assert not res.ok
    assert f"{removed.split('/', 1)[1]}: missing from the archive" in res.problems
    assert f"runs/extra.txt: not in {PACKAGE_MANIFEST}" in res.problems


@pytest.mark.parametrize("kind", ["traversal", "absolute", "symlink", "hardlink", "device"])
def test_unsafe_members_are_refused_when_reading(decision: tuple[Path, Path], tmp_path: Path, kind: str) -> None:
    _, archive = decision
    members = _members(archive)
    root = next(iter(members)).split("/", 1)[0]
    info: tarfile.TarInfo
    if kind == "traversal":
        info = tarfile.TarInfo(f"{root}/../../etc/cron.d/x")
    elif kind == "absolute":
        info = tarfile.TarInfo("/etc/cron.d/x")
    elif kind == "symlink":
        info = tarfile.TarInfo(f"{root}/runs/link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/shadow"
    elif kind == "hardlink":
        info = tarfile.TarInfo(f"{root}/runs/hard")
        info.type, info.linkname = tarfile.LNKTYPE, "/etc/shadow"
    else:
        info = tarfile.TarInfo(f"{root}/runs/dev")
        info.type = tarfile.CHRTYPE
    bad = tmp_path / f"{kind}.tar.gz"
    _write(bad, members, [info])
    proc = k3fleet("verify-evidence", str(bad), "--json")
    assert proc.returncode == 3
    report = json.loads(proc.stdout)
    assert any(p.startswith(info.name) and "refused" in p for p in report["problems"]), report["problems"]
    # Verification only reads: nothing was written outside (or inside) the working directory.
    assert not (tmp_path / "etc").exists()


def test_not_an_archive_and_missing_file_are_one_line_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"this is not gzip\n")
    proc = k3fleet("verify-evidence", str(junk))
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    plain = tmp_path / "plain.tar.gz"
    with gzip.open(plain, "wb") as fh:
        fh.write(b"no tar inside")
    assert k3fleet("verify-evidence", str(plain)).returncode == 3
    missing = k3fleet("verify-evidence", str(tmp_path / "nope.tar.gz"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_decide_refuses_a_tampered_or_unfinished_run(healthy_audit: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered"
    shutil.copytree(healthy_audit, tampered)
    facts = tampered / "facts" / "gpu-b01.json"
    facts.write_text(facts.read_text().replace("580.95.05", "580.95.06", 1))
    proc = k3fleet("decide", str(tampered), "--reviewer", "carol", "--runs-dir", str(tmp_path / "r"))
    assert proc.returncode == 3
    assert "facts/gpu-b01.json: changed" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()  # nothing decided, nothing written
    unfinished = tmp_path / "unfinished"
    shutil.copytree(healthy_audit, unfinished)
    (unfinished / "manifest.json").unlink()
    proc = k3fleet("decide", str(unfinished), "--reviewer", "carol", "--runs-dir", str(tmp_path / "r"))
    assert proc.returncode == 3 and "did not finish" in proc.stderr


def test_packaging_never_follows_a_symlink_out_of_a_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "command.json").write_text("{}\n")
    secret = tmp_path / "outside.txt"
    secret.write_text("not evidence\n")
    (run / "stolen.txt").symlink_to(secret)
    with pytest.raises(Exception, match="symlink out of the run directory"):
        write_package(tmp_path / "p.tar.gz", "pkg", run, [], {}, mtime=__import__("datetime").datetime.now())
    assert not (tmp_path / "p.tar.gz").exists()
    assert not list(tmp_path.glob(".p.tar.gz.*"))


def test_a_secret_value_from_the_environment_is_never_packaged(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.txt").write_text("loaded model with hf_abcdefghijklmnop123 from cache\n")
    with pytest.raises(Exception, match=r"log.txt contains the value of \$HF_TOKEN"):
        write_package(tmp_path / "p.tar.gz", "pkg", run, [], {}, mtime=__import__("datetime").datetime.now(),
                      environ={"HF_TOKEN": "hf_abcdefghijklmnop123", "PATH": "/usr/bin"})
    assert not (tmp_path / "p.tar.gz").exists()


def test_package_json_goes_through_the_redactor(tmp_path: Path) -> None:
    """PACKAGE.json was written without the redactor: a secret pasted into --owner, --rollback-owner or
    the profile's name or rate limits stood in the signed package."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "command.json").write_text("{}\n")
    canaries = ["canary-owner-5d8e21", "canary-rollback-0c4f77", "canary-profile-9a1b30", "canary-limits-6e2d95"]
    meta = {"service_owner": f"serving-team api key: {canaries[0]}", "rollback_owner": f"erin password {canaries[1]}",
            "profile": {"name": f"prod token={canaries[2]}", "sha256": "0" * 64},
            "rate_limits": ["4 concurrent requests", f"gateway secret: {canaries[3]}"],
            "reviewer": "carol <carol@example.org>"}
    write_package(tmp_path / "p.tar.gz", "pkg", run, [], meta, mtime=__import__("datetime").datetime.now())
    members = _members(tmp_path / "p.tar.gz")
    manifest = next(v for k, v in members.items() if k.endswith("/PACKAGE.json")).decode()
    for canary in canaries:
        assert canary not in manifest, manifest
    parsed = json.loads(manifest)
    assert parsed["reviewer"] == "carol <carol@example.org>" and parsed["rate_limits"][0] == "4 concurrent requests"
