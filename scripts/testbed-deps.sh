#!/usr/bin/env bash
# Install the Debian packages the real testbed (k3fleet.lab.testbed) needs on the machine itself.
# Idempotent and non-interactive (scripts/deps-common.sh): packages already present are left alone,
# apt runs only when something is missing. Nothing survives between CI machines, so CI calls this
# every run.
set -euo pipefail
# shellcheck source=deps-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/deps-common.sh"

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

install_missing testbed-deps "${PACKAGES[@]}"
