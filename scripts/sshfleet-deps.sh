#!/usr/bin/env bash
# Debian packages the SSH lab fleet (k3fleet lab ssh-fleet) needs on the machine itself: sshd to
# run in each host's network namespace, ssh, ip and nsenter. Idempotent; apt runs only when
# something is missing. The package's own sshd service is never started (policy-rc.d here, and
# the fleet starts its own sshd processes in the foreground).
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "sshfleet-deps: must run as root (apt-get install); current uid $(id -u)" >&2
    exit 2
fi

PACKAGES=(openssh-server openssh-client iproute2 util-linux)
missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "sshfleet-deps: all ${#PACKAGES[@]} packages present"
    exit 0
fi
echo "sshfleet-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -q -o DPkg::Lock::Timeout=600 update
apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}"
echo "sshfleet-deps: done"
