"""Benchmark: the redactor's time per line, by line length, for adversarial line shapes.

Figures only (no assertions). The redactor must take time linear in the line length
(docs/safety.md "Redaction"): a 64 KB base64 line in a start-up log or a capture, or a
100,000-character --host, must not stall a command. For each shape and each length the
script times ``redact_text`` on one line (the best of --repeat runs) and prints the time and
the time per 1,000 characters: a linear redactor keeps the second column flat as the length
grows; a backtracking one grows it with the length.

    python scripts/bench_redact.py
    python scripts/bench_redact.py --lengths 1000 10000 100000 --shapes base64 kv-chain
    python scripts/bench_redact.py --budget 30   # stop a shape once one line takes longer than 30 s
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import time
from collections.abc import Callable

from k3fleet.evidence.redact import redact_text


def _repeat(unit: str) -> Callable[[int], str]:
    def make(n: int) -> str:
        return (unit * (n // len(unit) + 1))[:n]
    return make


def _base64(n: int) -> str:
    raw = base64.b64encode(os.urandom(n * 3 // 4 + 3)).decode()
    return raw[:n]


# Each shape is one line that keeps a naive pattern retrying at every position.
SHAPES: dict[str, Callable[[int], str]] = {
    "base64": _base64,
    "kv-chain": _repeat("a="),                 # a=a=a=... (KEY=VALUE with no end)
    "quotes": _repeat('"'),                    # """..." (quoted values that never close)
    "quote-key": _repeat('"a'),                # "a"a"a... (quoted keys)
    "options": _repeat("-a "),                 # -a -a -a ... (--option value)
    "secret-options": _repeat("--token "),     # --token --token ... (secret options in a row)
    "colons": _repeat("a:"),                   # a:a:a: (URL user-info and KEY: value)
    "url-prefix": _repeat("a://"),             # scheme:// with no user-info
    "words": _repeat("token "),                # prose key words without values
    "dict-repr": _repeat("{'api_key': ['"),    # vLLM's non-default args, never closed
    "bearer": _repeat("bearer "),
    "key-run": lambda n: ":" + "a" * (n - 1),   # one long word after a separator (a key that never ends)
    "url-run": lambda n: "http://" + "a" * (n - 7),  # a URL's user-info that never reaches its @
    "token-run": lambda n: "=hf_" + "a" * (n - 4),  # a token prefix and a long word
    "mixed-log": _repeat("INFO 01-05 10:00:00 [api_server.py:1] args: model=/m, port=8000, token=abc; "),
}
LENGTHS = (1_000, 10_000, 64_000, 100_000, 1_000_000)


def _time(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    ap.add_argument("--repeat", type=int, default=3, help="runs per line; the best is reported")
    ap.add_argument("--budget", type=float, default=20.0,
                    help="skip the longer lines of a shape once one line took more than this many seconds")
    args = ap.parse_args(argv)

    print(f"{'shape':16s} {'chars':>10s} {'seconds':>10s} {'us/1k chars':>12s}")
    for name in args.shapes:
        over = False
        for n in sorted(args.lengths):
            if over:
                print(f"{name:16s} {n:10d} {'skipped':>10s} {'(budget)':>12s}")
                continue
            line = SHAPES[name](n)
            # One run first: a slow line is reported once rather than --repeat times.
            t0 = time.perf_counter()
            try:
                redact_text(line)
            except RecursionError:  # a recursive rule on a deep line: reported, not timed
                print(f"{name:16s} {n:10d} {'error':>10s} {'RecursionError':>12s}", flush=True)
                over = True
                continue
            first = time.perf_counter() - t0
            if first <= args.budget / 4:
                first = min(first, _time(lambda line=line: redact_text(line), args.repeat))
            took = first
            print(f"{name:16s} {n:10d} {took:10.4f} {took / n * 1e9:12.1f}", flush=True)
            over = took > args.budget
    return 0


if __name__ == "__main__":
    sys.exit(main())
