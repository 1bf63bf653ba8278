# Shared by scripts/*-deps.sh (sourced, not run): install the Debian packages a part of k3fleet
# needs on the machine itself. Idempotent and non-interactive: packages already present are left
# alone and apt runs only when something is missing; nothing survives between CI machines, so CI
# calls the scripts every run.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/deps-common.sh"
#   install_missing NAME ENTRY...      ENTRY is "package" or "package:why"; NAME prefixes every line

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    echo "deps-common.sh: source it from a scripts/*-deps.sh script; it does nothing on its own" >&2
    exit 2
fi

install_missing() {
    local name="$1"
    shift
    if [ "$(id -u)" -ne 0 ]; then
        echo "$name: must run as root (apt-get install); current uid $(id -u)" >&2
        exit 2
    fi
    local entry pkg
    local missing=()
    for entry in "$@"; do
        pkg="${entry%%:*}"
        # dpkg-query prints "install ok installed" only for fully configured packages.
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        echo "$name: all $# packages present"
        return 0
    fi
    echo "$name: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Another engineer or CI step may hold the dpkg lock for a while; wait instead of failing.
    local apt_opts=(-y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef
                    -o Dpkg::Options::=--force-confold)
    apt-get -q -o DPkg::Lock::Timeout=600 update
    apt-get install "${apt_opts[@]}" --no-install-recommends "${missing[@]}"
    echo "$name: done"
}
