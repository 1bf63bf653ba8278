"""The lab's stand-in ``mpirun`` for the NCCL pair test (docs/facts.md section 17).

A real launcher starts all_reduce_perf on both nodes of a pair; a lab host's stand-in checks what a
real one would need of the nodes named by ``-H`` (each a lab host beside this one, with Open MPI and
all_reduce_perf on its PATH) and prints a recorded two-node run: the low pair's when either host's
link is low, the good pair's otherwise (k3fleet/lab/active_data/SOURCES.md). The recordings sit in the
host's ``.replay/mpirun/`` under fixed keys (:func:`pair_recording_argv`), and a low link is a
recording of :func:`pair_link_argv`, so a partner's link is read from the partner's own root: a pair
costs one recording per host, not one per possible partner.
"""

from __future__ import annotations

from k3fleet.lab.replay import REPLAY_DIR, system_tool

_SCRIPT = """\
#!/bin/sh
# k3fleet lab stand-in mpirun (k3fleet.lab.mpirun): a two-node all_reduce_perf between lab hosts.
case $0 in */*) b=${0%/*} ;; *) b=. ;; esac
case $b in */*) r=${b%/*} ;; *) r=. ;; esac
key() { printf '%s\\n' "$@" | @MD5SUM@ | { read -r k _; printf '%s' "$k"; }; }
hosts=
app=
prev=
for a do
  case $prev in -H|--host) hosts=$a ;; esac
  case ${a##*/} in all_reduce_perf) app=$a ;; esac
  prev=$a
done
if [ -z "$hosts" ] || [ -z "$app" ]; then
  printf 'mpirun: no lab recording for: %s\\n' "$*" >&2
  exit 2
fi
link=good
low=$(key mpirun lab-link low)
IFS=,
for h in $hosts; do
  n=${h%%:*}
  d=$r/../$n
  if [ ! -d "$d/bin" ]; then
    printf 'mpirun (lab): %s is not a lab host beside this one\\n' "$n" >&2
    exit 1
  fi
  if [ ! -x "$d/bin/mpirun" ]; then
    printf 'mpirun (lab): %s: orted: command not found (no Open MPI on that host)\\n' "$n" >&2
    exit 1
  fi
  if [ ! -x "$d/bin/${app##*/}" ]; then
    printf 'mpirun (lab): %s: %s: command not found\\n' "$n" "${app##*/}" >&2
    exit 1
  fi
  [ -f "$d/@REPLAY@/mpirun/$low.out" ] && link=low
done
unset IFS
f=$r/@REPLAY@/mpirun/$(key mpirun lab-pair "$link").out
if [ ! -f "$f" ]; then
  printf 'mpirun: no lab recording for: %s\\n' "$*" >&2
  exit 2
fi
@CAT@ "$f"
"""


def pair_recording_argv(link: str) -> list[str]:
    """The key under which a host's stand-in finds the two-node run of a ``good`` or ``low`` pair."""
    return ["mpirun", "lab-pair", link]


def pair_link_argv(link: str) -> list[str]:
    """Recorded (empty) on a host whose link is ``low``: every pair with it prints the low run."""
    return ["mpirun", "lab-link", link]


def mpirun_script() -> str:
    who = "the lab's mpirun"
    return (_SCRIPT.replace("@MD5SUM@", system_tool("md5sum", who)).replace("@CAT@", system_tool("cat", who))
            .replace("@REPLAY@", REPLAY_DIR))
