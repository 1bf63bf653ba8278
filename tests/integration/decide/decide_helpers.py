"""Running the k3fleet command line from the decision tests (imported by their conftest and tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# The production profile the quick schedule covers: 4 concurrent sessions, a 1024-token p99 context, 1.5 s
# sustained, two production tools, one response schema, a multimodal share (docs/decision.md). Here, not in
# conftest.py: several test directories have a conftest module, and which one `import conftest` finds
# depends on what the worker collected last.
LAB_PROFILE = REPO / "k3fleet" / "targets" / "profiles" / "lab-small.yaml"


def k3fleet(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    bindir = Path(sys.executable).parent
    full = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}", **(env or {})}
    return subprocess.run([str(bindir / "k3fleet"), *args], capture_output=True, text=True,
                          env=full, timeout=timeout, check=False, cwd=cwd)


def signed_unapproved(audit: Path, sign_key: Path, out: Path) -> Path:
    """carol's decision over ``audit`` signed with ``sign_key`` into ``out`` (its package beside it); with no
    acceptance run it is not approved (exit 3)."""
    proc = k3fleet("decide", str(audit), "--reviewer", "carol", "--out", str(out), "--sign-key", str(sign_key))
    assert proc.returncode == 3, proc.stderr[-2000:]
    return out


def load_probe_ran(run: Path) -> bool:
    """Whether ``accept all`` ran the load probe (it names the probes it did not run)."""
    import json

    return "load" not in (json.loads((run / "accept.json").read_text()).get("not_run") or {})


# -- OpenSSH keys for signed evidence -------------------------------------------------------------------

# The reviewer the decisions name is carol: the signer's principal must be hers (docs/decision.md "Signing and
# verification": a signature binds the reviewer it names).
SIGNER = "carol@example.org"
PASSPHRASE = "correct horse battery staple"


class EvidenceKeys:
    """Throwaway ed25519 keys made by the real ``ssh-keygen``: the reviewer's (allowed), a
    stranger's (in no allowed-signers file) and an encrypted one (signs only through ssh-agent)."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.key = self._keygen(root / "reviewer")
        self.stranger = self._keygen(root / "stranger")
        self.encrypted = self._keygen(root / "encrypted", passphrase=PASSPHRASE)
        self.fingerprint = fingerprint(self.key)
        self.stranger_fingerprint = fingerprint(self.stranger)
        self.allowed = root / "allowed_signers"
        self.allowed.write_text(self.allowed_line(self.key))
        # The reviewer's key, but allowed only for git commits: not for evidence.
        self.wrong_namespace = root / "allowed_signers.git"
        self.wrong_namespace.write_text(self.allowed_line(self.key, "git"))

    @staticmethod
    def _keygen(path: Path, passphrase: str = "") -> Path:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", path.name, "-f", str(path)],
                       check=True, capture_output=True, timeout=60)
        return path

    @staticmethod
    def allowed_line(key: Path, namespace: str = "k3fleet-evidence", principal: str = SIGNER) -> str:
        pub = key.with_name(key.name + ".pub").read_text().split()
        return f'{principal} namespaces="{namespace}" {pub[0]} {pub[1]}\n'


def fingerprint(key: Path) -> str:
    """The key's SHA256 fingerprint as ssh-keygen prints it."""
    proc = subprocess.run(["ssh-keygen", "-l", "-f", str(key.with_name(key.name + ".pub"))], check=True,
                          capture_output=True, text=True, timeout=60)
    return proc.stdout.split()[1]


# -- rewriting a package as an attacker with a signing key would -----------------------------------------


def sshsig(key: Path, data: bytes, tmp: Path) -> bytes:
    """The real ``ssh-keygen -Y sign`` signature of ``data`` in the evidence namespace."""
    msg = tmp / "signed-manifest"
    msg.write_bytes(data)
    sig = msg.with_name(msg.name + ".sig")
    sig.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", "k3fleet-evidence", str(msg)], check=True,
                   capture_output=True, stdin=subprocess.DEVNULL, timeout=60)
    return sig.read_bytes()


def rewrite_package(members: dict[str, bytes], edits: dict[str, bytes], *, run_manifests: bool = True,
                    key: Path | None = None, tmp: Path | None = None) -> dict[str, bytes]:
    """``members`` (archive name -> bytes) with ``edits`` (names relative to the package root) applied and
    PACKAGE.json made to match; with ``run_manifests`` each edited run's own manifest.json is regenerated too
    (a thorough forger), and with ``key`` PACKAGE.json names that key and is signed by it again."""
    import hashlib
    import json

    out = dict(members)
    root = next(iter(out)).split("/", 1)[0]
    for rel, data in edits.items():
        out[f"{root}/{rel}"] = data
        if run_manifests:
            parts = rel.split("/")
            run = "/".join(parts[:1] if parts[0] == "decision" else parts[:2])
            name = f"{root}/{run}/manifest.json"
            manifest = json.loads(out[name])
            for f in manifest["files"]:
                if f"{run}/{f['path']}" == rel:
                    f["sha256"], f["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
            out[name] = (json.dumps(manifest, indent=2) + "\n").encode()
    package = json.loads(out[f"{root}/PACKAGE.json"])
    for f in package["files"]:
        name = f"{root}/{f['path']}"
        f["sha256"], f["bytes"] = hashlib.sha256(out[name]).hexdigest(), len(out[name])
    if key is not None:
        package["signer"] = {"key_fingerprint": fingerprint(key), "key_type": "ED25519",
                             "namespace": "k3fleet-evidence", "format": "sshsig"}
    out[f"{root}/PACKAGE.json"] = (json.dumps(package, indent=2) + "\n").encode()
    if key is not None:
        assert tmp is not None
        out[f"{root}/PACKAGE.json.sig"] = sshsig(key, out[f"{root}/PACKAGE.json"], tmp)
    return out


def read_members(archive: Path) -> dict[str, bytes]:
    import tarfile

    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def write_members(archive: Path, members: dict[str, bytes]) -> None:
    import io
    import tarfile

    with tarfile.open(archive, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
