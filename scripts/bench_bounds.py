#!/usr/bin/env python3
"""Peak memory and wall time of the CLI on hostile inputs, against the caps of k3fleet.bounds.

Each case runs the real `k3fleet` command in a subprocess, reaped with wait4 so its own peak RSS
is read (not the sum of all children): a start-up log that is /dev/zero, a gzip bomb as a log and
as a pasted capture, an oversize sparse capture, an evidence package whose member is a bomb, and
a loopback server that sends an endless /v1/models body, an endless /metrics page, or one byte
every 0.2 s. Issue 35's cases follow: YAML alias bombs and deep nests in a profile, owners, build
and target file, a profile of 40,000 tools, signing keys and inventories that are a FIFO, /dev/zero
or a huge sparse file, an alias bomb in host_vars, JSON nested 200,000 deep in a run file, a pasted
`docker inspect` and a prefix-lint line, an --out name of 300 bytes, a 60M-token ladder rung, a
50 MB vLLM log to triage, a server that trickles its chat answers to `accept agent`, and an ssh agent
socket that accepts and never answers `decide --sign-key`. It prints
exit code, wall seconds and peak RSS per case, with the line that stopped it. Nothing is asserted:
machines differ (tests/integration/test_bounds_and_writes.py holds the 300 MB bound, the issue 35
cases are tests/unit/test_input_limits.py).

    .venv/bin/python scripts/bench_bounds.py [--bomb-mb 200] [--timeout 2] [--log-mb 50] [--only-structure]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

import test_bounds_and_writes as t  # noqa: E402  (the same bombs and servers the tests use)
from accept_servers import loopback, trickling_chat  # noqa: E402  (the trickling chat server the tests use)


def run(args: list[str], tmp: Path) -> tuple[int, float, int, str]:
    start = time.monotonic()
    ran = t.k3fleet(*args, tmp=tmp)
    line = next((s for s in ran.stderr.splitlines() if s.startswith("k3fleet: error:")), "")
    return ran.rc, time.monotonic() - start, ran.maxrss_kb, line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bomb-mb", type=int, default=200, help="MiB of zeros in each bomb (default 200)")
    ap.add_argument("--timeout", default="2", help="--timeout for the trickling servers (default 2)")
    ap.add_argument("--only-structure", action="store_true", help="run only issue 35's cases (structure, files, "
                    "names, prompts, logs, the trickling chat)")
    ap.add_argument("--log-mb", type=int, default=50, help="MiB of the vLLM log triage judges (default 50)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-bounds-") as d:
        tmp = Path(d)
        if a.only_structure:
            _structure_cases(tmp, a)
            return 0
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
        _structure_cases(tmp, a)
    print(f"peak RSS bound in the tests: {t.MEMORY_LIMIT_KB / 1024:.0f} MB; issue 35 asks under 500 MB and 60 s")
    return 0


# -- issue 35: structure (nesting, aliases), files that are no regular small file, names, prompts, logs ----


def _bomb(levels: int = 9, width: int = 9) -> str:
    rows = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    rows += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(rows) + "\n"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _profile_dir(tmp: Path, name: str, tools: str) -> Path:
    d = tmp / name
    shutil.copytree(ROOT / "k3fleet" / "targets" / "profiles", d)
    (d / "tools" / "oncall_tools.json").write_text(tools)
    return d / "lab-small.yaml"


def _deep_run(tmp: Path) -> Path:
    from k3fleet.evidence import RunDir

    rd = RunDir.create(tmp, "audit", ["k3fleet", "audit"], out=tmp / "deep-run")
    (rd.path / "verdict.json").write_text("[" * 200_000 + "]" * 200_000)
    (rd.path / "run.json").write_text("{}")
    rd.write_manifest()
    return rd.path


def _big_log(path: Path, megabytes: int) -> Path:
    """A vLLM start-up (the decide fixture) followed by a long-running server's routine lines."""
    routine = "".join(f"(APIServer pid=1) INFO 08-14 10:00:{i % 60:02d} [loggers.py:123] Engine 000: Avg prompt "
                      f"throughput: {i}.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.2%\n"
                      f'(APIServer pid=1) INFO:     127.0.0.1:{40000 + i} - "POST /v1/chat/completions HTTP/1.1" '
                      "200 OK\n" for i in range(500))
    with path.open("w") as fh:
        fh.write((ROOT / "tests" / "fixtures" / "decide" / "startup_kimi_k3_tp8_dp2.log").read_text())
        while fh.tell() < megabytes << 20:
            fh.write(routine)
    return path


def _structure_cases(tmp: Path, a: argparse.Namespace) -> None:
    print(f"{'case (issue 35)':32s} {'exit':>4s} {'wall s':>7s} {'peak RSS MB':>11s}  line")
    deep_flow = "[" * 100_000 + "]" * 100_000
    fifo = tmp / "fifo.yml"
    os.mkfifo(fifo)
    key_dir = tmp / "keys"
    key_dir.mkdir()
    os.mkfifo(key_dir / "id_fifo")
    hv = tmp / "hv"
    (hv / "host_vars").mkdir(parents=True)
    (hv / "host_vars" / "gpu-01.yml").write_text(_bomb())
    _write(hv / "hosts.yml", "all:\n  hosts:\n    gpu-01:\n      ansible_host: 127.0.0.1\n")
    acc = tmp / "acc"
    t.k3fleet("accept", "all", "--base-url", "http://127.0.0.1:9", "--model", "m", "--log",
              str(ROOT / "tests" / "fixtures" / "decide" / "startup_kimi_k3_tp8_dp2.log"), "--skip", "prefix_cache",
              "--skip", "agent", "--skip", "load", "--out", str(acc), "--quiet", tmp=tmp)
    decide = ["decide", "--reviewer", "carol", "--runs-dir", str(tmp / "decisions"), str(acc)]
    accept = ["accept", "all", "--base-url", "http://127.0.0.1:9", "--model", "m", "--quiet",
              "--runs-dir", str(tmp / "accept-runs")]
    tools = json.dumps([{"name": f"t{i}", "parameters": {"type": "object"}} for i in range(40_000)])
    cases: list[tuple[str, list[str]]] = [
        ("profile alias bomb (9x9)", [*accept, "--profile", str(_write(tmp / "bomb-profile.yaml", _bomb()))]),
        ("profile 100k nested flow seqs", [*accept, "--profile", str(_write(tmp / "deep-profile.yaml", deep_flow))]),
        ("profile 40,000 tools (5 MB)", [*accept, "--profile", str(_profile_dir(tmp, "many-tools", tools))]),
        ("owners alias bomb", [*decide, "--owners", str(_write(tmp / "owners.yaml", _bomb()))]),
        ("build 5,000 nested objects", [*decide, "--build", str(_write(tmp / "build.yaml",
                                                                          '{"a":' * 5000 + "1" + "}" * 5000))]),
        ("target alias bomb", [*accept, "--target", str(_write(tmp / "target.yaml", _bomb()))]),
        ("decide --sign-key FIFO", [*decide, "--sign-key", str(key_dir / "id_fifo")]),
        ("decide --sign-key /dev/zero", [*decide, "--sign-key", "/dev/zero"]),
        ("decide --sign-key 300 MB sparse", [*decide, "--sign-key", str(t._sparse(key_dir / "id_sparse", 300))]),
        ("audit -i FIFO", ["audit", "-i", str(fifo), "--out", str(tmp / "a1")]),
        ("audit -i /dev/zero", ["audit", "-i", "/dev/zero", "--out", str(tmp / "a2")]),
        ("audit -i 200 MB sparse", ["audit", "-i", str(t._sparse(tmp / "sparse.yml", 200)), "--out", str(tmp / "a3")]),
        ("audit host_vars alias bomb", ["audit", "-i", str(hv / "hosts.yml"), "--out", str(tmp / "a4")]),
        ("audit --out 300-byte name", ["audit", "--lab", "--out", str(tmp / ("x" * 300))]),
        ("plan: verdict.json 200k deep", ["plan", "--run", str(_deep_run(tmp))]),
        ("triage docker inspect 200k deep", ["triage", "--kind", "docker_inspect", "--runs-dir", str(tmp / "tr"),
                                             str(_write(tmp / "inspect.json", '[{"Id": "x", "Config": '
                                                        + "[" * 200_000 + "]" * 200_000 + "}]"))]),
        ("prefix-lint line 200k deep", ["accept", "prefix-lint", str(_write(tmp / "req.jsonl", '{"messages": '
                                                                           + "[" * 200_000 + "]" * 200_000 + "}\n"))]),
        ("accept load --ladder 16,60000000", ["accept", "load", "--base-url", "http://127.0.0.1:9", "--model", "m",
                                              "--ladder", "16,60000000", "--runs-dir", str(tmp / "load")]),
        (f"triage {a.log_mb} MB vLLM log", ["triage", "--runs-dir", str(tmp / "tr-log"),
                                            str(_big_log(tmp / "big.log", a.log_mb))]),
    ]
    for name, args in cases:
        rc, wall, rss, line = run(args, tmp)
        print(f"{name:32s} {rc:4d} {wall:7.2f} {rss / 1024:11.1f}  {line[:110]}")
    stop = threading.Event()
    with loopback(trickling_chat(stop)) as url:
        try:
            rc, wall, rss, _ = run(["accept", "agent", "--base-url", url, "--model", "m", "--timeout", a.timeout,
                                    "-n", "1", "--json"], tmp)
        finally:
            stop.set()
    print(f"{'accept agent, trickling chat':32s} {rc:4d} {wall:7.2f} {rss / 1024:11.1f}  (--timeout {a.timeout}: "
          "every request, the SDK's included, under one deadline)")
    _silent_agent_case(tmp, decide)


def _silent_agent_case(tmp: Path, decide: list[str]) -> None:
    """`decide --sign-key` with SSH_AUTH_SOCK a unix socket that accepts and never answers (ssh-keygen waited
    on it for 120 s)."""
    import socket
    import subprocess
    import threading

    if shutil.which("ssh-keygen") is None:
        print(f"{'decide --sign-key, silent agent':32s} (skipped: no ssh-keygen)")
        return
    key = tmp / "keys" / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    where = Path(tempfile.mkdtemp(prefix="agent-", dir="/tmp")) / "s"  # a unix socket path is at most 108 bytes
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(where))
    listener.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        start = time.monotonic()
        ran = t.k3fleet(*decide, "--sign-key", str(key), tmp=tmp, env={"SSH_AUTH_SOCK": str(where)})
        wall = time.monotonic() - start
    finally:
        listener.close()
        for conn in held:
            conn.close()
        shutil.rmtree(where.parent)
    line = next((s for s in ran.stderr.splitlines() if s.startswith("k3fleet: error:")), "")
    print(f"{'decide --sign-key, silent agent':32s} {ran.rc:4d} {wall:7.2f} {ran.maxrss_kb / 1024:11.1f}  {line[:110]}")


if __name__ == "__main__":
    sys.exit(main())
