#!/usr/bin/env bash
# Install the Debian packages the real testbed (k3fleet.lab.testbed) needs on the machine itself.
# Idempotent and non-interactive: packages already present are left alone, apt runs only when
# something is missing. Nothing survives between CI machines, so CI calls this every run.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "testbed-deps: must run as root (apt-get install); current uid $(id -u)" >&2
    exit 2
fi

# Each entry is "package:why". The guest image itself is built by debootstrap, so nothing the
# guests need is listed here.
PACKAGES=(
    "debootstrap:builds the guest root filesystem"
    "systemd-container:systemd-nspawn boots the guests"
    "iproute2:ip netns / veth pairs"
    "util-linux:nsenter, mount, setsid"
    "openssh-client:ssh and ssh-keygen for the guests' root key"
    "slurm-wlm:slurmctld + slurmd on the machine itself"
    "munge:slurm authentication"
    "podman:container images without a Docker engine"
    "runc:podman runtime (crun fails on rlimits here)"
    "dpkg-dev:dpkg-scanpackages for the stand-in driver repository"
    "apt-utils:apt-ftparchive for the stand-in repository's Release file"
    "gcc:the stand-in repository compiles its NVML shim library"
    "libc6-dev:headers for that shim"
    "procps:pgrep/ps used by teardown checks"
    "kmod:modprobe for overlay when it is a module"
)

missing=()
for entry in "${PACKAGES[@]}"; do
    pkg="${entry%%:*}"
    # dpkg-query prints "install ok installed" only for fully configured packages.
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "testbed-deps: all ${#PACKAGES[@]} packages present"
    exit 0
fi

echo "testbed-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Another engineer or CI step may hold the dpkg lock for a while; wait instead of failing.
apt_opts=(-y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
apt-get -q -o DPkg::Lock::Timeout=600 update
apt-get install "${apt_opts[@]}" --no-install-recommends "${missing[@]}"
echo "testbed-deps: done"
