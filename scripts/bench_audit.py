"""Benchmark: the full audit against a one-command Ansible baseline on the same lab hosts.

For each fleet size, generate the lab fleet once, then time, side by side:
  baseline: ansible -m ansible.builtin.command -a 'cat <root>/proc/driver/nvidia/version'
  audit:    k3fleet audit --lab (same hosts, same forks)
and print wall time, controller CPU per host (user+sys of the whole process tree, which on the
local connection includes the module runs) and the audit/baseline ratio. No assertions: figures.

    python scripts/bench_audit.py --sizes 50 200 1000 --forks 10
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from k3fleet.lab.fleet import generate_fleet, load_fleet
from k3fleet.runner import ansible_env


def _measure(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1, 3, 4):
        sys.stderr.write(f"{argv[0]} exited {proc.returncode}: {proc.stderr[-800:]}\n")
    return wall, cpu, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 1000])
    ap.add_argument("--forks", type=int, default=10)
    args = ap.parse_args()
    bindir = Path(sys.executable).parent
    env = {**os.environ, **ansible_env(), "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    spec = load_fleet(None)
    print(f"{'hosts':>6} {'run':<9} {'wall s':>8} {'cpu s':>8} {'cpu/host s':>10} {'rc':>3}")
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix="k3fleet-bench-") as tmp:
            t0 = time.monotonic()
            inv = generate_fleet(spec, Path(tmp) / "fleet", count=n)
            gen = time.monotonic() - t0
            base = _measure([str(bindir / "ansible"), "all", "-i", str(inv), "-f", str(args.forks), "-o",
                             "-m", "ansible.builtin.command",
                             "-a", "cat {{ k3fleet_root }}/proc/driver/nvidia/version"], env)
            audit = _measure([str(bindir / "k3fleet"), "audit", "--lab", "--lab-count", str(n), "--forks",
                              str(args.forks), "--quiet", "--out", str(Path(tmp) / "run")], env)
            for name, (wall, cpu, rc) in (("baseline", base), ("audit", audit)):
                print(f"{n:>6} {name:<9} {wall:>8.1f} {cpu:>8.1f} {cpu / n:>10.3f} {rc:>3}")
            print(f"{n:>6} {'ratio':<9} {audit[0] / base[0]:>8.2f} {audit[1] / base[1]:>8.2f}"
                  f"   (lab generation {gen:.1f}s, inside the audit run too)")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
