#!/usr/bin/env python3
"""Benchmark: the audit on AWX's execution path, one controller against 2 and 4 execution nodes.

On the simulated lab fleet (local connection, scaled to --count hosts), side by side in one run:

  one controller: `k3fleet audit -i <lab inventory>` (the CLI, one ansible-playbook);
  N workers:      the fleet split in N `--limit` slices, each its own
                  `ansible-runner transmit | ansible-runner worker | ansible-runner process`
                  (three processes, two OS pipes; all slices at once, as a sliced AWX job runs on
                  N execution nodes), then `k3fleet merge` of the N processed artifact directories.

The pipelines are the integration test's (tests/integration/test_awx_stream.py). Per run: wall
seconds (for the workers: the streams, the merge, and both), CPU seconds of the whole process tree
(on the local connection that includes the modules, i.e. the nodes' side), the ratio of the wall
time to the one controller's, and whether the verdict is the one controller's. Every worker runs
on this machine, so N workers share its cores with each other: the split measures the streaming
path's cost, not the speed-up of N real execution nodes. Figures only, nothing is asserted.

    .venv/bin/python scripts/bench_awx_stream.py [--count 40] [--workers 1 2 4] [--forks 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import test_awx_stream as t  # noqa: E402  (the same pipelines the integration test runs)

from k3fleet.lab.fleet import generate_fleet, load_fleet  # noqa: E402


@dataclass
class Run:
    name: str
    wall_s: float
    cpu_s: float
    rc: int
    verdict: dict[str, object] | None
    stream_s: float | None = None
    merge_s: float | None = None
    error: str = ""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _verdict(stdout: str) -> dict[str, object] | None:
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def one_controller(base: Path, inventory: Path, forks: int) -> Run:
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = t.k3fleet("audit", "-i", str(inventory), "--forks", str(forks), "--json", "--out", str(base / "audit"),
                     "-q")
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    return Run("one controller (k3fleet audit)", wall, cpu, proc.returncode, _verdict(proc.stdout),
               error=proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() and not proc.stdout else "")


def workers(base: Path, inventory: Path, hosts: list[str], n: int, forks: int) -> Run:
    run_dir = base / f"workers-{n}"
    run_dir.mkdir()
    parts = t.slices(hosts, n)
    cpu0, t0 = _children_cpu(), time.perf_counter()
    done = t.stream_slices(run_dir, inventory, parts, forks)
    t1 = time.perf_counter()
    name = f"{len(parts)} worker(s), transmit | worker | process + merge"
    failed = [(pipe, rcs) for pipe, rcs in done if not t.ran(rcs)]
    if failed:
        pipe, rcs = failed[0]
        last = pipe.stderr().strip().splitlines()
        return Run(name, t1 - t0, _children_cpu() - cpu0, 2, None, stream_s=t1 - t0,
                   error=f"{pipe.ident}: stage exit codes {rcs}: {last[-1] if last else 'no output'}")
    proc = t.k3fleet("merge", *(str(pipe.job) for pipe, _ in done), "--json", "--out", str(run_dir / "merged"))
    t2 = time.perf_counter()
    return Run(name, t2 - t0, _children_cpu() - cpu0, proc.returncode, _verdict(proc.stdout), stream_s=t1 - t0,
               merge_s=t2 - t1, error=proc.stderr.strip().splitlines()[-1] if not proc.stdout else "")


def _difference(r: Run, ref: Run) -> str:
    """Where a verdict departs from the one controller's: the hosts, else the top-level fields."""
    a, b = t.stable(r.verdict), t.stable(ref.verdict)
    ha, hb = a.get("hosts", {}), b.get("hosts", {})
    hosts = sorted(h for h in set(ha) | set(hb) if ha.get(h) != hb.get(h))
    if hosts:
        return "hosts " + ", ".join(f"{h} ({(ha.get(h) or {}).get('status')} vs {(hb.get(h) or {}).get('status')})"
                                    for h in hosts[:5]) + (" ..." if len(hosts) > 5 else "")
    return "fields " + ", ".join(sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)))


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=40, help="lab hosts (the lab fleet cycled to this size)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4],
                    help="worker counts to split the fleet over (1: the whole fleet on one execution node)")
    ap.add_argument("--forks", type=int, default=20, help="forks of every ansible-playbook (each worker's too)")
    args = ap.parse_args()
    if args.count < 1 or args.forks < 1 or any(n < 1 for n in args.workers):
        print("bench_awx_stream: --count, --forks and --workers must be at least 1", file=sys.stderr)
        return 2
    print(f"lab fleet {args.count} hosts, forks {args.forks}, {os.cpu_count()} cores; load average {_load()}")
    with tempfile.TemporaryDirectory(prefix="bench-awx-") as tmp:
        base = Path(tmp)
        inventory = generate_fleet(load_fleet(None), base / "lab", count=args.count)
        hosts = t.lab_hosts(inventory)
        runs = [one_controller(base, inventory, args.forks)]
        runs += [workers(base, inventory, hosts, n, args.forks) for n in args.workers]
    ref = runs[0]
    print(f"{'run':<52} {'wall s':>7} {'stream s':>9} {'merge s':>8} {'CPU s':>7} {'wall ratio':>10} {'rc':>3}  "
          "verdict")
    for r in runs:
        ratio = f"{r.wall_s / ref.wall_s:.2f}" if ref.wall_s else ""
        if r is ref:
            same = "reference"
        elif r.verdict is None or ref.verdict is None:
            same = "none"
        else:
            same = "same" if t.stable(r.verdict) == t.stable(ref.verdict) else f"DIFFERENT: {_difference(r, ref)}"
        print(f"{r.name:<52} {r.wall_s:>7.1f} {_fmt(r.stream_s):>9} {_fmt(r.merge_s):>8} {r.cpu_s:>7.1f} {ratio:>10} "
              f"{r.rc:>3}  {same}")
        if r.error:
            print(f"  {r.error}")
    print(f"load average after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
