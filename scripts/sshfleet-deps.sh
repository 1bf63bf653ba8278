#!/usr/bin/env bash
# Debian packages the SSH lab fleet (k3fleet lab ssh-fleet) needs on the machine itself: sshd to
# run in each host's network namespace, ssh, ip and nsenter. Idempotent; apt runs only when
# something is missing. The package's own sshd service is never started (policy-rc.d here, and
# the fleet starts its own sshd processes in the foreground). Shared part: scripts/deps-common.sh.
set -euo pipefail
# shellcheck source=deps-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/deps-common.sh"

PACKAGES=(openssh-server openssh-client iproute2 util-linux)
install_missing sshfleet-deps "${PACKAGES[@]}"
