#!/usr/bin/env bash
# Install the Debian packages the demo's change night needs (k3fleet.lab.changelab): the stand-in
# driver repository is built with gcc and dpkg-dev, indexed with apt-utils, and planned on by the
# real apt resolver through python3-apt. Idempotent and non-interactive (scripts/deps-common.sh).
set -euo pipefail
# shellcheck source=deps-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/deps-common.sh"

# Each entry is "package:why".
PACKAGES=(
    "gcc:the stand-in driver repository compiles its NVML shim library"
    "libc6-dev:headers for that shim"
    "dpkg-dev:dpkg-scanpackages indexes the stand-in repository"
    "apt-utils:apt-ftparchive writes the stand-in repository's Release file"
    "python3-apt:the package module plans the transaction with the real apt resolver"
    "openssh-client:ssh-keygen makes the throwaway key that signs the demo's evidence package"
)

install_missing demo-deps "${PACKAGES[@]}"
