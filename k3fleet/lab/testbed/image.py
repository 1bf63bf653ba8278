"""The guest image: debootstrap once, cache as a tarball keyed on the package list, prepare per run.

The Debian mirror is read from this machine's own apt sources at run time, never stored in the
repository. Guests have no route to any mirror: their only apt source is the stand-in driver
repository bind-mounted read-only at /srv/k3fleet-repo.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from k3fleet.lab.common.proc import run
from k3fleet.lab.testbed.errors import TestbedError
from k3fleet.lab.testbed.state import GUEST_CONTAINERS, GUEST_IMAGE_STORE, GUEST_REPO_MOUNT

SUITE = "bookworm"
VARIANT = "minbase"
# What the guests need: systemd as init, sshd for Ansible, python3 + python3-apt for Ansible's
# apt modules, iproute2/procps/kmod for the collectors' commands, podman for the serving image (the
# change night's smoke, the container probe). Nothing else: 2 cores are shared.
INCLUDE: tuple[str, ...] = (
    "python3",
    "python3-apt",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "iproute2",
    "procps",
    "kmod",
    "podman",
    # Inside a guest runc cannot make cgroups (systemd-nspawn mounts the v1 hierarchies read-only);
    # crun runs containers without them.
    "crun",
    # debootstrap does not resolve the virtual container-network-stack that podman's containers-common
    # needs; containers here only ever get --network host or none.
    "netavark",
)
# Bump when the way the tarball is made changes, so old caches are not reused.
IMAGE_FORMAT = 1

SOURCES_LIST = Path("/etc/apt/sources.list")
SOURCES_DIR = Path("/etc/apt/sources.list.d")
MIRROR_ENV = "K3FLEET_TESTBED_MIRROR"

# Units that would start apt or disk jobs inside every guest on their own and hold the dpkg lock
# while a test upgrades a package.
MASKED_UNITS: tuple[str, ...] = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "apt-daily.service",
    "apt-daily-upgrade.service",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "systemd-tmpfiles-clean.timer",
    # podman's API service and its timers: nothing in a guest talks to them.
    "podman.service",
    "podman.socket",
    "podman-auto-update.service",
    "podman-auto-update.timer",
)

# podman inside a guest (checked on this kind of machine in a systemd-nspawn guest): crun with cgroups
# off (the v1 hierarchies are read-only in the guest), no session keyring (nspawn's seccomp filter
# refuses keyctl), no default sysctls (/proc/sys is read-only), the fixed ulimits of the machine's own
# podman, and logs and events in files, not the guest's journal.
GUEST_CONTAINERS_CONF = """\
# k3fleet testbed guest: podman inside systemd-nspawn.
[containers]
cgroups = "disabled"
keyring = false
default_sysctls = []
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
log_driver = "k8s-file"
[engine]
runtime = "crun"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
# The images come from the machine's store, mounted read-only; containers live in a tmpfs (overlay
# layers cannot sit on the guest's own overlay root).
GUEST_STORAGE_CONF = f"""\
# k3fleet testbed guest: the machine's images read-only, this guest's containers in a tmpfs.
[storage]
driver = "overlay"
graphroot = "{GUEST_CONTAINERS}/storage"
runroot = "/run/containers/storage"
[storage.options]
additionalimagestores = ["{GUEST_IMAGE_STORE}"]
"""
# What `--device nvidia.com/gpu=all` gives a container, as `nvidia-ctk cdi generate` writes it for a
# real driver (its libraries and device nodes): here the stand-in driver's state, its /proc view
# (/run/nvidia-sim, written at boot by the loaded "kernel module") and its hardware file with the
# testbed's serving fault knob (/etc/nvidia-sim). CDI 0.5.0 is what podman 4.3 reads.
GUEST_CDI_SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
  - name: all
    containerEdits:
      env:
        - NVIDIA_VISIBLE_DEVICES=all
containerEdits:
  mounts:
    - hostPath: /run/nvidia-sim
      containerPath: /run/nvidia-sim
      options: [ro, nosuid, nodev, rbind]
    - hostPath: /etc/nvidia-sim
      containerPath: /etc/nvidia-sim
      options: [ro, nosuid, nodev, rbind]
"""
# Both directories the spec mounts exist from boot, driver packages or not (a missing source would
# fail every GPU container, not only those on a node without a driver).
GUEST_TMPFILES = "d /run/nvidia-sim 0755 root root -\n"

SSHD_CONFIG = """\
# k3fleet testbed: key-only root login; StrictModes off because the overlay's owners are the image's.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
"""


def cache_key(include: tuple[str, ...] = INCLUDE, suite: str = SUITE, variant: str = VARIANT) -> str:
    """Key of the cached tarball: changes whenever the package list or the way it is built changes."""
    material = json.dumps(
        {"suite": suite, "variant": variant, "include": sorted(include), "format": IMAGE_FORMAT},
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    stanza: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if stanza:
                yield stanza
            stanza, last = {}, ""
            continue
        if line[0] in " \t" and last:
            stanza[last] += " " + line.strip()
            continue
        if ":" in line:
            key, _, value = line.partition(":")
            last = key.strip().lower()
            stanza[last] = value.strip()
    if stanza:
        yield stanza


def mirror_from_sources(sources_list: str, deb822_files: list[str], suite: str = SUITE) -> str | None:
    """First `deb` URI that serves `suite` itself (not -security/-updates), from either apt format."""
    for text in deb822_files:
        for stanza in _deb822_stanzas(text):
            if stanza.get("enabled", "yes").lower() == "no":
                continue
            if "deb" not in stanza.get("types", "").split():
                continue
            if suite not in stanza.get("suites", "").split():
                continue
            uris = stanza.get("uris", "").split()
            if uris:
                return uris[0]
    for line in sources_list.splitlines():
        line = line.split("#", 1)[0].strip()
        # deb [options] URI suite components...
        match = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
        if match and match.group(2) == suite:
            return match.group(1)
    return None


def machine_mirror(suite: str = SUITE) -> str:
    """The Debian mirror this machine's apt already uses (or the operator's override)."""
    override = os.environ.get(MIRROR_ENV)
    if override:
        return override
    deb822 = []
    if SOURCES_DIR.is_dir():
        deb822 = [p.read_text(errors="replace") for p in sorted(SOURCES_DIR.glob("*.sources"))]
    one_line = SOURCES_LIST.read_text(errors="replace") if SOURCES_LIST.exists() else ""
    one_line += "".join(p.read_text(errors="replace") for p in sorted(SOURCES_DIR.glob("*.list")))
    mirror = mirror_from_sources(one_line, deb822, suite)
    if mirror is None:
        raise TestbedError(
            f"testbed image: no apt source for suite {suite!r} in {SOURCES_LIST} or {SOURCES_DIR}/*.sources; "
            f"set {MIRROR_ENV} to a Debian mirror URL"
        )
    return mirror


@contextmanager
def _cache_lock(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".image.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def tarball_path(cache: Path, key: str | None = None) -> Path:
    return cache / f"rootfs-{key or cache_key()}.tar"


def ensure_image(cache: Path, *, log: Path | None = None) -> tuple[Path, Path]:
    """Return (tarball, extracted rootfs) for the current package list, building what is missing.

    The extracted tree is the read-only lower layer of every guest's overlay. It is rebuilt from
    the tarball when absent, and the tarball from debootstrap when absent.
    """
    key = cache_key()
    tarball = tarball_path(cache, key)
    rootfs = cache / f"image-{key}" / "rootfs"
    marker = rootfs.parent / "extracted.json"
    with _cache_lock(cache):
        if not tarball.exists():
            _debootstrap_to_tarball(cache, key, tarball, log)
        if not marker.exists():
            if rootfs.parent.exists():
                shutil.rmtree(rootfs.parent)
            rootfs.mkdir(parents=True)
            run(
                ["tar", "-C", str(rootfs), "--numeric-owner", "--xattrs", "--xattrs-include=*", "-xpf", str(tarball)],
                what=f"testbed image: extracting {tarball.name}",
                timeout=600,
            )
            marker.write_text(json.dumps({"key": key, "tarball": tarball.name, "at": time.time()}))
    return tarball, rootfs


def _debootstrap_to_tarball(cache: Path, key: str, tarball: Path, log: Path | None) -> None:
    mirror = machine_mirror()
    build = cache / f"build-{key}"
    if build.exists():
        shutil.rmtree(build)
    argv = [
        "debootstrap",
        f"--variant={VARIANT}",
        f"--include={','.join(INCLUDE)}",
        SUITE,
        str(build),
        mirror,
    ]
    started = time.monotonic()
    try:
        proc = run(argv, what="testbed image: debootstrap", timeout=1200, check=False)
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            # debootstrap's own log names the package that failed.
            detail = ""
            debootstrap_log = build / "debootstrap" / "debootstrap.log"
            if debootstrap_log.exists():
                detail = " ".join(debootstrap_log.read_text(errors="replace").split()[-60:])
            raise TestbedError(
                f"testbed image: debootstrap {SUITE} from {mirror} exited {proc.returncode}: "
                f"{' '.join((proc.stderr or proc.stdout).split()[-40:])} {detail}".strip()
            )
        partial = tarball.with_suffix(".tar.partial")
        run(
            ["tar", "-C", str(build), "--numeric-owner", "--xattrs", "--xattrs-include=*", "-cf", str(partial), "."],
            what=f"testbed image: packing {tarball.name}",
            timeout=600,
        )
        os.replace(partial, tarball)
        sidecar = {
            "suite": SUITE,
            "variant": VARIANT,
            "include": list(INCLUDE),
            "key": key,
            "seconds": round(time.monotonic() - started, 1),
        }
        tarball.with_suffix(".json").write_text(json.dumps(sidecar, indent=2))
    finally:
        if build.exists():
            shutil.rmtree(build)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(text)
    os.chmod(path, mode)


def prepare_image(rootfs: Path, *, public_key: str) -> None:
    """Apply the testbed's settings to the lower layer (idempotent, no overlay may be mounted on it)."""
    ssh_dir = rootfs / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    _write(ssh_dir / "authorized_keys", public_key.strip() + "\n", 0o600)
    _write(rootfs / "etc" / "ssh" / "sshd_config.d" / "k3fleet-testbed.conf", SSHD_CONFIG)

    # The only apt source: the stand-in driver repository. Guests cannot reach any mirror.
    apt = rootfs / "etc" / "apt"
    if (apt / "sources.list").exists():
        (apt / "sources.list").unlink()
    for stale in (apt / "sources.list.d").glob("*"):
        stale.unlink()
    _write(
        apt / "sources.list.d" / "k3fleet-repo.list",
        f"deb [trusted=yes] file:{GUEST_REPO_MOUNT} ./\n",
    )
    # No translations to fetch from a file: repository.
    _write(apt / "apt.conf.d" / "90k3fleet-testbed", 'Acquire::Languages "none";\n')
    (rootfs / GUEST_REPO_MOUNT.lstrip("/")).mkdir(parents=True, exist_ok=True)

    # Services installed by apt inside a guest must start (it is a full systemd host).
    policy = rootfs / "usr" / "sbin" / "policy-rc.d"
    if policy.exists() or policy.is_symlink():
        policy.unlink()

    systemd_dir = rootfs / "etc" / "systemd" / "system"
    systemd_dir.mkdir(parents=True, exist_ok=True)
    for unit in MASKED_UNITS:
        link = systemd_dir / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
    # podman in the guests: its settings, the stand-in GPUs' CDI spec, and the mount points.
    _write(rootfs / "etc" / "containers" / "containers.conf", GUEST_CONTAINERS_CONF)
    _write(rootfs / "etc" / "containers" / "storage.conf", GUEST_STORAGE_CONF)
    _write(rootfs / "etc" / "cdi" / "nvidia.yaml", GUEST_CDI_SPEC)
    _write(rootfs / "usr" / "lib" / "tmpfiles.d" / "k3fleet-nvidia-sim.conf", GUEST_TMPFILES)
    for mount_point in (GUEST_IMAGE_STORE, GUEST_CONTAINERS, "/etc/nvidia-sim"):
        (rootfs / mount_point.lstrip("/")).mkdir(parents=True, exist_ok=True)

    # Each guest gets its own machine-id in its upper layer; an empty one here means "generate".
    _write(rootfs / "etc" / "machine-id", "")


def guest_host_keys(merged: Path) -> list[str]:
    """A fresh set of SSH host keys for one guest (each machine has its own, as in a fleet), written
    into its writable layer; returns the public keys as ``type base64`` for known_hosts."""
    ssh = merged / "etc" / "ssh"
    for old in ssh.glob("ssh_host_*"):
        old.unlink()
    run(["ssh-keygen", "-A", "-f", str(merged)], what=f"testbed: host keys for {merged}")
    keys = []
    for pub in sorted(ssh.glob("ssh_host_*_key.pub")):
        kind, blob = pub.read_text().split()[:2]
        keys.append(f"{kind} {blob}")
    if not keys:
        raise TestbedError(f"testbed: ssh-keygen -A wrote no host keys under {ssh}")
    return keys


def prepare_guest(merged: Path, *, hostname: str, address: str, machine_id: str, pynvml_source: Path | None) -> None:
    """Per-guest files, written into the guest's own writable layer before its first boot."""
    _write(merged / "etc" / "hostname", hostname + "\n")
    _write(
        merged / "etc" / "hosts",
        f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n{address}\t{hostname}\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n",
    )
    _write(merged / "etc" / "machine-id", machine_id + "\n", 0o444)
    _write(
        merged / "etc" / "ssh" / "sshd_config.d" / "k3fleet-listen.conf",
        f"ListenAddress {address}\n",
    )
    target = merged / "usr" / "lib" / "python3" / "dist-packages" / "pynvml.py"
    if pynvml_source is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pynvml_source, target)
        os.chmod(target, 0o644)
    elif target.exists():
        target.unlink()
