#!/usr/bin/env python3
"""How closely ``accept load --trace`` keeps a trace's arrival times: a synthetic trace replayed on the
simulator, the arrival error printed.

A trace of ``--rate`` requests/s (Poisson arrivals, seeded) for ``--seconds`` is written to a temporary
JSON Lines file (``prompt_tokens`` and ``output_tokens`` only), replayed by the load probe's trace phase
against a simulator (``k3fleet lab serve-vllm``) started in its own process on loopback, and the arrival
error of each request (when the replay dispatched it minus when the trace said, ``arrival_lag`` of the
run) is printed as p50, p99 and max in milliseconds with the achieved rate and the client's CPU seconds.
The figure wanted is the p99 at 200 requests/s on 2 cores (docs/acceptance-load.md "Trace replay").
Nothing is asserted: machines differ, and a busy one shows in the figures.

    .venv/bin/python scripts/bench_trace.py [--rate 200] [--seconds 10] [--output-tokens 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from k3fleet.accept.client import Endpoint
from k3fleet.accept.load import LoadOptions, run_load
from k3fleet.accept.load.arrivals import arrival_offsets


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _simulator:
    """``k3fleet lab serve-vllm`` on a free loopback port, up until /health answers; stopped on exit."""

    def __enter__(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        exe = Path(sys.executable).with_name("k3fleet")
        self.proc = subprocess.Popen([str(exe), "lab", "serve-vllm", "--port", str(port), "--itl-ms", "1",
                                      "--prefill-ms-per-token", "0", "--max-num-seqs", "1024"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1):
                    return url
            except OSError:
                time.sleep(0.1)
        self.proc.terminate()
        raise SystemExit("bench_trace: the simulator did not answer /health within 20 s")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not (0 < args.rate <= 2000 and 0 < args.seconds <= 120 and 1 <= args.repeat <= 10):
        print("bench_trace: --rate 0-2000, --seconds 0-120, --repeat 1-10", file=sys.stderr)
        return 2
    offsets = arrival_offsets(args.rate, args.seconds, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        path.write_text("".join(json.dumps({"arrival_s": round(t, 6), "prompt_tokens": args.prompt_tokens,
                                            "output_tokens": args.output_tokens}) + "\n" for t in offsets))
        # The simulator in its own process (not a thread of this one: the client's event loop must not share a
        # GIL with the server), its engine steps short so it never queues: the error measured is the client's.
        with _simulator() as base_url:
            ep = Endpoint(base_url=base_url, model="moonshotai/Kimi-K3", timeout_s=60)
            opts = LoadOptions(phases=["trace"], trace_path=str(path), max_requests=len(offsets) + 10,
                               ttft_p95_slo_s=3600, itl_p95_slo_s=3600, sample_interval_s=1.0,
                               max_duration_s=args.seconds * 10 + 60)
            print(f"trace: {len(offsets)} requests over {args.seconds:g} s ({len(offsets) / args.seconds:.1f}/s "
                  f"offered), {args.prompt_tokens} prompt tokens, {args.output_tokens} out; simulator on loopback")
            print(f"{'run':>3} {'lag p50 ms':>11} {'lag p99 ms':>11} {'lag max ms':>11} {'ok':>6} {'req/s':>8} "
                  f"{'client CPU s':>13}")
            for i in range(args.repeat):
                cpu0 = _cpu()
                res = asyncio.run(run_load(ep, opts))
                cpu = _cpu() - cpu0
                (row,) = [r for r in res.data["curves"] if r["phase"] == "trace"]
                p50, p99 = row["arrival_lag_p50_s"], row["arrival_lag_p99_s"]
                print(f"{i + 1:>3} {p50 * 1000:>11.2f} {p99 * 1000:>11.2f} {row['arrival_lag_max_s'] * 1000:>11.2f} "
                      f"{row['ok']:>6} {row['ok'] / max(row['duration_s'], 1e-9):>8.1f} {cpu:>13.2f}"
                      + ("" if res.status == "pass" else f"  ({res.status}: {res.reason})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
