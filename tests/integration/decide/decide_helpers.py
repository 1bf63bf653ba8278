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


def load_probe_ran(run: Path) -> bool:
    """Whether ``accept all`` ran the load probe (it names the probes it did not run)."""
    import json

    return "load" not in (json.loads((run / "accept.json").read_text()).get("not_run") or {})


# -- OpenSSH keys for signed evidence -------------------------------------------------------------------

SIGNER = "reviewer@example.org"
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
