#!/usr/bin/env bash
# Install the Debian packages the report tests need: the HTML report is rendered in a real headless
# browser (Debian's chromium; Playwright's own browser download does not work on these machines).
# Idempotent and non-interactive: apt runs only when something is missing. CI calls it every run.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "report-deps: must run as root (apt-get install); current uid $(id -u)" >&2
    exit 2
fi

# Each entry is "package:why".
PACKAGES=(
    "chromium:headless rendering of the HTML report (DOM assertions and a screenshot)"
    "fonts-dejavu-core:a font for the screenshot (chromium draws boxes without one)"
)

missing=()
for entry in "${PACKAGES[@]}"; do
    pkg="${entry%%:*}"
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "report-deps: all ${#PACKAGES[@]} packages present"
    exit 0
fi

echo "report-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Another engineer or CI step may hold the dpkg lock for a while; wait instead of failing.
apt_opts=(-y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
apt-get -q -o DPkg::Lock::Timeout=600 update
apt-get install "${apt_opts[@]}" --no-install-recommends "${missing[@]}"
echo "report-deps: done"
