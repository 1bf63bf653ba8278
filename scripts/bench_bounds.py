#!/usr/bin/env python3
"""Peak memory and wall time of the CLI on hostile inputs, against the caps of k3fleet.bounds.

Each case runs the real `k3fleet` command in a subprocess, reaped with wait4 so its own peak RSS
is read (not the sum of all children): a start-up log that is /dev/zero, a gzip bomb as a log and
as a pasted capture, an oversize sparse capture, an evidence package whose member is a bomb, and
a loopback server that sends an endless /v1/models body, an endless /metrics page, or one byte
every 0.2 s. It prints exit code, wall seconds and peak RSS per case, with the cap that stopped
it. Nothing is asserted: machines differ (tests/integration/test_bounds_and_writes.py holds the
300 MB bound).

    .venv/bin/python scripts/bench_bounds.py [--bomb-mb 200] [--timeout 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import test_bounds_and_writes as t  # noqa: E402  (the same bombs and servers the tests use)


def run(args: list[str], tmp: Path) -> tuple[int, float, int, str]:
    start = time.monotonic()
    ran = t.k3fleet(*args, tmp=tmp)
    line = next((s for s in ran.stderr.splitlines() if s.startswith("k3fleet: error:")), "")
    return ran.rc, time.monotonic() - start, ran.maxrss_kb, line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bomb-mb", type=int, default=200, help="MiB of zeros in each bomb (default 200)")
    ap.add_argument("--timeout", default="2", help="--timeout for the trickling server (default 2)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-bounds-") as d:
        tmp = Path(d)
        cases: list[tuple[str, list[str]]] = [
            ("startup --log /dev/zero", ["accept", "startup", "--log", "/dev/zero"]),
            ("startup --log gzip bomb", ["accept", "startup", "--log",
                                         str(t._gzip_zeros(tmp / "log.gz", a.bomb_mb))]),
            ("triage gzip bomb", ["triage", str(t._gzip_zeros(tmp / "cap.gz", a.bomb_mb))]),
            ("triage sparse file", ["triage", str(t._sparse(tmp / "big.txt", a.bomb_mb))]),
            ("verify-evidence tar bomb", ["verify-evidence", str(t._tar_bomb(tmp / "p.tar.gz", a.bomb_mb))]),
        ]
        print(f"{'case':32s} {'exit':>4s} {'wall s':>7s} {'peak RSS MB':>11s}  line")
        for name, args in cases:
            rc, wall, rss, line = run(args, tmp)
            print(f"{name:32s} {rc:4d} {wall:7.2f} {rss / 1024:11.1f}  {line[:110]}")
        for mode, extra in (("models_endless", []), ("trickle", ["--timeout", a.timeout])):
            with t.server(mode) as url:
                rc, wall, rss, line = run(["accept", "prefix-cache", "--base-url", url, "--model", "m", *extra], tmp)
            print(f"{'HTTP ' + mode:32s} {rc:4d} {wall:7.2f} {rss / 1024:11.1f}  {line[:110]}")
        with t.server("metrics_endless") as url:
            rc, wall, rss, _ = run(["accept", "all", "--base-url", url, "--model", "m", "--skip", "prefix_cache",
                                    "--skip", "agent", "--skip", "load", "--quiet", "--out", str(tmp / "run")], tmp)
        print(f"{'HTTP metrics_endless':32s} {rc:4d} {wall:7.2f} {rss / 1024:11.1f}  (metrics_error in accept.json)")
    print(f"peak RSS bound in the tests: {t.MEMORY_LIMIT_KB / 1024:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
