"""OpenSSH signatures over an evidence package (docs/decision.md "Signing and verification").

A package's ``PACKAGE.json`` holds the sha256 of every other member, so a signature over its exact
bytes covers the whole package. Signing uses a key an SRE already has (``ssh-keygen -Y sign``, a
private key file or a public key whose private half is in ``ssh-agent``), in the namespace
``k3fleet-evidence`` so that a signature made for anything else (a git commit, a file) never
passes for one over evidence. Verifying asks ``ssh-keygen -Y find-principals`` whom the signing
key belongs to in an allowed-signers file, then ``ssh-keygen -Y verify`` whether that principal
signed these bytes in this namespace: the allowed-signers file is the only root of trust.

``ssh-keygen`` runs without a terminal and with stdin closed: an encrypted key whose private half
is not in the agent fails at once instead of waiting for a passphrase nobody can type.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from k3fleet.bounds import read_input
from k3fleet.errors import IncompleteError, UsageError
from k3fleet.evidence.layout import PACKAGE_MANIFEST, PACKAGE_SIGNATURE

NAMESPACE = "k3fleet-evidence"
SIGNATURE_SUFFIX = ".sig"
# ssh-keygen answers in milliseconds; an agent that asks for confirmation may take a while.
_TIMEOUT_S = 120
# ssh-keygen asks the agent (SSH_AUTH_SOCK) for its keys before it signs with any key, a private key file
# included, and waits on it without a deadline: the agent is asked first, under this one.
AGENT_TIMEOUT_S = 10.0
# The agent protocol's SSH_AGENTC_REQUEST_IDENTITIES (draft-miller-ssh-agent, section 4.4), framed by length.
_REQUEST_IDENTITIES = b"\x00\x00\x00\x01\x0b"
# What the probe signature covers: never evidence, so it cannot be replayed as a package's.
_PROBE = b"k3fleet: can this key sign? (not evidence)\n"
_GOOD = re.compile(r'^Good "(?P<ns>[^"]*)" signature (?:for (?P<principal>.+) )?with (?P<type>\S+) key '
                   r"(?P<fp>\S+)\s*$", re.M)


def _ssh_keygen() -> str:
    exe = shutil.which("ssh-keygen")
    if exe is None:
        raise IncompleteError("ssh-keygen is not on PATH: install the OpenSSH client (openssh-client) to sign "
                              "or verify evidence packages")
    return exe


def _run(args: list[str], *, stdin: bytes | None = None, what: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_ASKPASS", "SSH_ASKPASS_REQUIRE", "DISPLAY")}
    try:
        return subprocess.run([_ssh_keygen(), *args], input=stdin if stdin is not None else b"",
                              capture_output=True, timeout=_TIMEOUT_S, check=False, env=env,
                              start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise IncompleteError(f"{what}: ssh-keygen did not answer within {_TIMEOUT_S}s") from exc
    except OSError as exc:
        raise IncompleteError(f"{what}: cannot run ssh-keygen: {exc.strerror or exc}") from exc


def _said(proc: subprocess.CompletedProcess[bytes]) -> str:
    """ssh-keygen's own words, one line, without its progress chatter and prompts."""
    text = proc.stderr.decode("utf-8", "replace").replace("Enter passphrase:", "\n")
    skip = ("Signing file", "Signing data on standard input", "Write signature to", "Could not verify signature.")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(skip)]
    return "; ".join(lines)[:300] or f"exit status {proc.returncode}"


def _check_readable(path: Path, option: str, kind: str) -> None:
    """A key or allowed-signers file is a regular file under the ``key`` cap, read with that bound before
    ssh-keygen sees it: a FIFO nobody writes, /dev/zero or a huge sparse file is one line at once
    (k3fleet.bounds; docs/safety.md "Bounds"), never a wait or a read of gigabytes."""
    read_input(path, option, kind=kind, limit="key")


def check_agent(option: str, *, timeout_s: float | None = None) -> None:
    """The ssh agent named by ``SSH_AUTH_SOCK`` answers a request for its keys within ``timeout_s``, or one
    line and exit 3 (a request past its deadline, docs/safety.md "Bounds"): ssh-keygen would wait on it
    for as long as the agent stays silent. No agent, or one that refuses the connection, is left to
    ssh-keygen (it signs with the key file then)."""
    timeout_s = AGENT_TIMEOUT_S if timeout_s is None else timeout_s
    where = os.environ.get("SSH_AUTH_SOCK")
    if not where:
        return
    try:
        if not stat.S_ISSOCK(os.stat(where).st_mode):
            return
    except OSError:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(where)
        except TimeoutError as exc:
            raise IncompleteError(f"{option}: the ssh agent at {where} (SSH_AUTH_SOCK) did not accept a connection "
                                  f"within {timeout_s:g} s: restart ssh-agent or unset SSH_AUTH_SOCK") from exc
        except OSError:
            return
        try:
            sock.sendall(_REQUEST_IDENTITIES)
            sock.recv(4)  # any answer, or a hang-up: ssh-keygen goes on with the agent or without it
        except TimeoutError as exc:
            raise IncompleteError(f"{option}: the ssh agent at {where} (SSH_AUTH_SOCK) did not answer within "
                                  f"{timeout_s:g} s: restart ssh-agent or unset SSH_AUTH_SOCK") from exc
        except OSError:
            return


@dataclass(frozen=True)
class SigningKey:
    """A key that has shown it can sign: its path, type and SHA256 fingerprint."""

    path: Path
    key_type: str
    fingerprint: str

    def sign(self, data: bytes) -> bytes:
        """The armored SSH signature of ``data`` in the evidence namespace."""
        with tempfile.TemporaryDirectory(prefix="k3fleet-sign-") as tmp:
            msg = Path(tmp) / "message"
            msg.write_bytes(data)
            proc = _run(["-Y", "sign", "-f", str(self.path), "-n", NAMESPACE, str(msg)],
                        what=f"--sign-key {self.path}")
            sig = msg.with_name(msg.name + SIGNATURE_SUFFIX)
            if proc.returncode != 0 or not sig.is_file():
                raise UsageError(f"--sign-key {self.path} cannot sign: {_said(proc)} (an encrypted key needs its "
                                 "private half in ssh-agent: ssh-add it first)")
            return sig.read_bytes()

    def record(self) -> dict[str, str]:
        """What PACKAGE.json says about its signer (checked against the signature when verifying)."""
        return {"key_fingerprint": self.fingerprint, "key_type": self.key_type, "namespace": NAMESPACE,
                "format": "sshsig"}


def signature_key(data: bytes, signature: bytes) -> tuple[str, str] | None:
    """(key type, fingerprint) of the key that made ``signature`` over ``data``, when it is one;
    says nothing about whom the key belongs to."""
    with tempfile.TemporaryDirectory(prefix="k3fleet-sig-") as tmp:
        sig = Path(tmp) / "message.sig"
        sig.write_bytes(signature)
        proc = _run(["-Y", "check-novalidate", "-n", NAMESPACE, "-s", str(sig)], stdin=data,
                    what="signature check")
    m = _GOOD.search(proc.stdout.decode("utf-8", "replace"))
    return (m["type"], m["fp"]) if proc.returncode == 0 and m else None


def signing_key(path: Path) -> SigningKey:
    """The key at ``path``, once it has signed a probe: a missing, unreadable or encrypted key (without
    the agent) fails here, before anything is written."""
    _check_readable(path, "--sign-key", "an OpenSSH key")
    check_agent(f"signing with {path}")
    probe = SigningKey(path=path, key_type="?", fingerprint="?")
    sig = probe.sign(_PROBE)
    key = signature_key(_PROBE, sig)
    if key is None:
        raise UsageError(f"--sign-key {path}: ssh-keygen made a signature it cannot read back")
    return SigningKey(path=path, key_type=key[0], fingerprint=key[1])


@dataclass
class SignatureCheck:
    """The outcome of checking one signature against an allowed-signers file."""

    verified: bool
    principal: str | None = None
    key_type: str | None = None
    fingerprint: str | None = None
    reason: str | None = None
    # Whether the verified principal is the reviewer the signed statement names (None: no reviewer asked).
    bound: bool | None = None


def _ids(name: str) -> set[str]:
    """The ways a person is named: ``carol``, ``carol@example.org``, ``carol <carol@example.org>``; case-blind,
    the part before ``@`` included (as ``signoff.same_person`` compares operators and reviewers)."""
    name = name.strip().lower()
    found = {name, *re.findall(r"<([^<>\s]+)>", name)}
    bare = re.sub(r"\s*<[^<>]*>\s*", "", name).strip()
    if bare:
        found.add(bare)
    return {i for i in found if i} | {i.split("@", 1)[0] for i in found if "@" in i}


def names_reviewer(principal: str, reviewer: str) -> bool:
    """Whether an allowed-signers principal is the reviewer a decision names."""
    return bool(_ids(principal) & _ids(reviewer))


def verify_signature(data: bytes, signature: bytes, allowed_signers: Path,
                     reviewer: str | None = None) -> SignatureCheck:
    """Whether a principal of ``allowed_signers`` signed ``data`` in the evidence namespace; with ``reviewer``,
    also whether that principal is the reviewer (its own name, or a principal the file grants the key for
    the reviewer's name: ``ssh-keygen -Y verify -I REVIEWER``)."""
    _check_readable(allowed_signers, "--allowed-signers", "an allowed-signers file")
    key = signature_key(data, signature)
    if key is None:
        return SignatureCheck(False, reason=f"the signature does not match {PACKAGE_MANIFEST} (or is not an SSH "
                                            f"signature in the {NAMESPACE} namespace)")
    key_type, fp = key
    with tempfile.TemporaryDirectory(prefix="k3fleet-verify-") as tmp:
        sig = Path(tmp) / PACKAGE_SIGNATURE
        sig.write_bytes(signature)
        found = _run(["-Y", "find-principals", "-s", str(sig), "-f", str(allowed_signers)],
                     what=f"--allowed-signers {allowed_signers}")
        principals = [p.strip() for line in found.stdout.decode("utf-8", "replace").splitlines()
                      for p in line.split(",") if p.strip()]
        if found.returncode != 0 or not principals:
            return SignatureCheck(False, key_type=key_type, fingerprint=fp, reason=(
                f"signed by {key_type} key {fp}, which is not in {allowed_signers} ({_said(found)})"))
        last = ""
        first: SignatureCheck | None = None
        # The reviewer's own principals first; then the reviewer's name itself, which the file may grant
        # through a principal pattern; then any other principal (verified, but not bound to the reviewer).
        tries = sorted(principals, key=lambda p: not (reviewer and names_reviewer(p, reviewer)))
        if reviewer and not any(names_reviewer(p, reviewer) for p in principals):
            tries.insert(0, reviewer.strip())
        for principal in tries:
            proc = _run(["-Y", "verify", "-f", str(allowed_signers), "-I", principal, "-n", NAMESPACE,
                         "-s", str(sig)], stdin=data, what=f"--allowed-signers {allowed_signers}")
            m = _GOOD.search(proc.stdout.decode("utf-8", "replace"))
            if proc.returncode == 0 and m and m["ns"] == NAMESPACE:
                name = m["principal"] or principal
                bound = None if reviewer is None else (names_reviewer(principal, reviewer)
                                                       or names_reviewer(name, reviewer))
                check = SignatureCheck(True, principal=name, key_type=m["type"], fingerprint=m["fp"], bound=bound)
                if bound is not False:
                    return check
                first = first or check
            else:
                last = f"{principal}: {_said(proc)}"
        if first is not None:
            return first
    return SignatureCheck(False, key_type=key_type, fingerprint=fp,
                          reason=f"signed by {key_type} key {fp}, which {allowed_signers} does not allow "
                                 f"for {NAMESPACE} ({last})")
