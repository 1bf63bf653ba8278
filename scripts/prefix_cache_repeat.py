"""Run `k3fleet accept prefix-cache --json` many times in a row on the lab's real vLLM and count outcomes.

Two servers, one after the other: prefix caching on (every run must pass) and `--no-enable-prefix-caching`
(every run must fail). Prints the counts, the statuses in order and the longest settling wait per run;
exits 1 when either count falls short. With `--capture DIR` it also keeps, from the caching-on server,
its `/metrics` page after the runs, `/version`, `/v1/models` and one streamed answer with logprobs:
the recorded real outputs the unit tests use (tests/fixtures/*/SOURCES.md names them).

The real vLLM is one instance per machine: run this under its lock, e.g.

    flock /tmp/k3fleet-vllm.lock .venv/bin/python scripts/prefix_cache_repeat.py -n 20

(docs/acceptance.md, "accept prefix-cache"; the venv and model come from `k3fleet lab vllm prepare`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from k3fleet.lab import vllm


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _runs(base_url: str, n: int, repeats: int) -> list[dict[str, Any]]:
    exe = Path(sys.executable).parent / "k3fleet"
    out = []
    for i in range(1, n + 1):
        t0 = time.monotonic()
        proc = subprocess.run([str(exe), "accept", "prefix-cache", "--base-url", base_url, "--model",
                               vllm.SERVED_NAME, "--repeats", str(repeats), "--json"],
                              capture_output=True, text=True, timeout=600, check=False)
        try:
            res = json.loads(proc.stdout)
        except ValueError:
            res = {"status": f"no JSON (exit {proc.returncode})", "reason": proc.stderr.strip()[-300:], "data": {}}
        settle = (res.get("data") or {}).get("settle") or {}
        out.append({"run": i, "exit": proc.returncode, "status": res.get("status"), "reason": res.get("reason"),
                    "max_settle_s": settle.get("max_waited_s"), "wall_s": round(time.monotonic() - t0, 1),
                    "answers_same": [c.get("same") for c in ((res.get("data") or {}).get("answers") or {})
                                     .get("comparisons", [])]})
        _say(f"  run {i}/{n}: {out[-1]['status']} (exit {proc.returncode}, {out[-1]['wall_s']} s, longest settle "
             f"{out[-1]['max_settle_s']} s)")
    return out


def _capture(base_url: str, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with httpx.Client(timeout=60) as client:
        root = base_url.removesuffix("/v1")
        (dest / "metrics.txt").write_text(client.get(root + "/metrics").text)
        (dest / "version.json").write_text(client.get(root + "/version").text)
        (dest / "models.json").write_text(client.get(root + "/v1/models").text)
        body = {"model": vllm.SERVED_NAME, "messages": [{"role": "user", "content": "Name one GPU."}],
                "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2, "stream": True}
        with client.stream("POST", root + "/v1/chat/completions", json=body) as resp:
            (dest / "stream_logprobs.sse").write_text("".join(resp.iter_text()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20, help="runs per server (default 20)")
    ap.add_argument("--repeats", type=int, default=5, help="warm requests per run (default 5)")
    ap.add_argument("--capture", type=Path, default=None, help="keep the caching-on server's real outputs here")
    ap.add_argument("--only", choices=("on", "off"), default=None, help="run one of the two servers only")
    args = ap.parse_args()
    if not 1 <= args.n <= 200 or not 1 <= args.repeats <= 100:
        print("prefix_cache_repeat: -n must be 1-200 and --repeats 1-100", file=sys.stderr)
        return 2
    modes = [("on", [], "pass"), ("off", ["--no-enable-prefix-caching"], "fail")]
    report: dict[str, Any] = {}
    short = False
    for name, extra, want in modes:
        if args.only not in (None, name):
            continue
        with tempfile.TemporaryDirectory(prefix=f"k3fleet-pc-{name}-") as tmp:
            work = Path(tmp)
            try:
                state = vllm.up(0, extra, workdir=work, progress=_say)
                _say(f"caching {name}: {args.n} runs against {state.base_url}")
                runs = _runs(state.base_url, args.n, args.repeats)
                if args.capture is not None and name == "on":
                    _capture(state.base_url, args.capture)
                    (args.capture / "startup.log").write_text(state.log.read_text(errors="replace"))
            finally:
                vllm.down(work)
        counts = Counter(r["status"] for r in runs)
        report[name] = {"want": want, "counts": dict(counts), "runs": runs}
        short = short or counts.get(want, 0) != args.n
        print(f"caching {name}: {counts.get(want, 0)}/{args.n} {want} ({dict(counts)}); longest settle wait "
              f"{max((r['max_settle_s'] or 0) for r in runs):.2f} s")
    if args.capture is not None:
        (args.capture / "repeat-report.json").write_text(json.dumps(report, indent=1))
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
