"""The evidence package from real runs: written safely, verified later, tampering named file by file."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from decide_helpers import k3fleet

from k3fleet.decide.package import PACKAGE_MANIFEST, verify_package, write_package

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def decision(healthy_audit: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("pkg") / "decision"
    proc = k3fleet("decide", str(healthy_audit), "--reviewer", "carol", "--out", str(out), "--json")
    assert proc.returncode == 3, proc.stderr[-2000:]  # no acceptance run: evidence missing
    archive = out.with_name(out.name + ".tar.gz")
    assert archive.is_file()
    return out, archive


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
    assert listed == {n.removeprefix(f"{root}/") for n in members} - {PACKAGE_MANIFEST}
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
    # Nothing in it is a link, a device or world-writable; every size matches.
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar:
            assert m.isfile() and m.mode == 0o644 and m.uid == 0
    ok = k3fleet("verify-evidence", str(archive))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"intact: {len(listed)} files match" in ok.stdout


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
