#!/usr/bin/env bash
# Install the Debian packages the report tests need: the HTML report is rendered in a real headless
# browser (Debian's chromium; Playwright's own browser download does not work on these machines).
# Idempotent and non-interactive (scripts/deps-common.sh): apt runs only when something is missing.
set -euo pipefail
# shellcheck source=deps-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/deps-common.sh"

# Each entry is "package:why".
PACKAGES=(
    "chromium:headless rendering of the HTML report (DOM assertions and a screenshot)"
    "fonts-dejavu-core:a font for the screenshot (chromium draws boxes without one)"
)

install_missing report-deps "${PACKAGES[@]}"
