#!/usr/bin/env python3
"""Time and measure validation + verdict + change plan on large generated fleets: the streaming
verdict beside the batch and the per-host paths.

Generates N host fact dicts per size (default 10,000 and 100,000) from the synthetic fixtures in
tests/fixtures/verdict, as a production fleet looks the night before the change: R575 and R580
hosts, H200/H100/B200, each host with its own name and GPU UUIDs, most hosts clean, a few percent
in each realistic fault class (GPUDirect missing, GPUs held by a model server outside the
scheduler, a GPU missing, Fabric Manager down, a rail down, NCCL debug left on, package facts
unreadable, image drift, a pending reboot, persistence off), 30% running jobs, 3% drained, and
25 unreachable hosts. The plan therefore has a canary and waves, so the planner is measured too.

Three paths, each size of each in a fresh process (so no two share a peak RSS, read with
resource.getrusage after the runs), best of --repeat runs by wall time:

  stream    evaluate_stream over a generator: each host's facts are made (parsed from JSON, as the
            controller receives them) and validated and judged as they come; nothing of the input is
            held. The time spent making the facts is measured inside the generator and left out:
            the figure is validation + verdict + plan, like the others'.
  batch     validate_facts over every host's facts held in memory, then evaluate_fleet (the audit's
            path: Ansible's results are in memory anyway).
  per-host  each host validated whole (HostFacts.model_validate) and every rule run on each host:
            the path before sections were shared (--baseline-sizes).

The batch and per-host peaks include the generated facts they hold. Where two paths run at one
size, their verdicts are compared (SHA-256 of the verdict JSON). Growth between the sizes is
printed against linear growth. Nothing is asserted: machines differ, and a machine shared with
other work inflates wall time (CPU seconds are shown beside it, and the load average).

    .venv/bin/python scripts/bench_verdict.py [--sizes 10000 100000] [--repeat 3]
        [--baseline-sizes 10000] [--batch-sizes 10000 100000]

--merge N measures the product instead: N hosts' facts (the same generator) are written as
--slices audit run directories (through the run directory's writer, each with its manifest), then
`k3fleet merge` runs on them as a separate process, its wall time and peak RSS read from the
process's own resource usage (os.wait4):

    .venv/bin/python scripts/bench_verdict.py --merge 100000 [--slices 10]
        -> merge 100000 hosts: X s wall, Y MB peak RSS

The generated fleet has failing hosts on purpose (fault classes above), so the merge answers exit 1
(checks failed, k3fleet/contracts.py): 0, 1 and 3 are the verdict's exits and count as a finished
benchmark when the merged run records that exit and verifies against its manifest; a usage error,
a refused slice or a crash fails it (exit 1 of this script, with the merge's last line).

Beside it, on the same slices and without k3fleet, the floor any merge that verifies its slices,
reads every host once and writes every host's file pays on this machine (--no-floor skips it):
`sha256sum` of every slice file (verifying the slices against their manifests), `cp -r` of the
slices' facts directories (writing one file per host) and Python's C `json.loads` of every facts
file (parsing each host once), each timed as its own process (os.wait4), then merge / floor as a
ratio of CPU seconds, and the floor's CPU spread over the cores this process may use.

K3FLEET_BENCH_PROFILE=FILE runs that merge under cProfile, its statistics into FILE.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from k3fleet.contracts import EXIT_CODES, EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE  # noqa: E402
from k3fleet.evidence import RunDir, layout, verify_run  # noqa: E402
from k3fleet.models.facts import HostFacts  # noqa: E402
from k3fleet.models.findings import FleetVerdict  # noqa: E402
from k3fleet.targets import load_target  # noqa: E402
from k3fleet.verdict import evaluate_fleet, evaluate_stream, validate_facts  # noqa: E402
from k3fleet.verdict.intake import gc_paused  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "verdict"
# What is asked of a 2-core controller: validation + verdict + plan in seconds, and peak RSS.
GOALS = {10_000: 1.0, 100_000: 5.0}
RSS_GOAL_MB = 1024
# Time growth asked of the stream for 10x the hosts.
GROWTH_GOAL = 10.5
PATHS = ("stream", "batch", "per-host")


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def _vary(base_json: str, name: str, index: int, rng: random.Random) -> dict[str, Any]:
    # Each host parsed from JSON, as the controller receives facts: no object shared between hosts.
    d: dict[str, Any] = json.loads(base_json)
    d["host"] = d["hostname"] = name
    d["scheduler"]["node"] = name
    d["duration_s"] = round(rng.uniform(1.5, 6.0), 3)
    drv = d["driver"]
    for g in drv["gpus"]:
        g["uuid"] = f"GPU-{index:08x}-{g['index']:04x}-4000-8000-{rng.getrandbits(48):012x}"
    r = rng.random()
    # Each branch below is one realistic fault class; most hosts stay clean.
    if r < 0.01:
        # GPUDirect missing: nvidia_peermem not loaded on proprietary modules.
        d["rdma"]["nvidia_peermem_loaded"] = False
    elif r < 0.02:
        # A model server outside the scheduler holds every GPU: never the canary.
        for g in drv["gpus"]:
            g["memory_used_mib"] = 131072
            g["processes"] = [{"pid": 48311, "type": "C", "name": "/usr/bin/python3", "used_memory_mib": 131072}]
    elif r < 0.03:
        drv["gpus"] = drv["gpus"][:7]
        drv["gpu_count"] = 7
    elif r < 0.05:
        d["fabricmanager"]["unit"]["active"] = "failed"
    elif r < 0.08:
        port = d["rdma"]["devices"][rng.randrange(8)]["ports"][0]
        port.update(state="DOWN", state_code=1, phys_state="Disabled", phys_state_code=3)
    elif r < 0.12:
        d["nccl"]["settings"]["NCCL_DEBUG"] = {"value": "INFO", "source": "env"}
    elif r < 0.14:
        d["packages"] = {"status": "unknown", "reason": "dpkg-query: command not found"}
    elif r < 0.16:
        d["container"]["image"]["digest"] = "sha256:0c4d1e2f3a5b"
    elif r < 0.18:
        drv["nvml"] = {"status": "lib_rm_version_mismatch", "error": "Driver/library version mismatch"}
    elif r < 0.20:
        for g in drv["gpus"]:
            g["persistence_mode"] = False
    s = rng.random()
    if s < 0.3:
        d["scheduler"].update(state="mixed", jobs_running=rng.randint(1, 4))
    elif s < 0.33:
        d["scheduler"].update(state="drained", reason="hw check")
    return d


def generate(n: int, seed: int) -> dict[str, dict[str, Any]]:
    return dict(iter_hosts(n, seed))


def iter_hosts(n: int, seed: int) -> Iterator[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    r575 = _load("host_r575_h200_hgx.json")
    # A production R575 fleet runs GPUDirect RDMA: nvidia_peermem is loaded (the fixture's host lacks
    # it, which would block every R575 host and leave the plan without canary or waves).
    r575["rdma"]["nvidia_peermem_loaded"] = True
    r580 = _load("host_r580_h200_hgx.json")
    b200 = _load("host_r580_b200_hgx.json")
    h100 = json.loads(json.dumps(r575))
    for g in h100["driver"]["gpus"]:
        g["name"], g["memory_total_mib"] = "NVIDIA H100 80GB HBM3", 81559
    bases = [(json.dumps(r575), 0.55), (json.dumps(h100), 0.15), (json.dumps(r580), 0.2), (json.dumps(b200), 0.1)]
    width = max(5, len(str(n - 1)))
    for i in range(n):
        x = rng.random()
        acc = 0.0
        base = bases[-1][0]
        for b, w in bases:
            acc += w
            if x < acc:
                base = b
                break
        name = f"gpu{i:0{width}d}"
        yield name, _vary(base, name, i, rng)


class _Source:
    """The generated hosts one at a time, with the wall time spent making them and freeing them again
    (the input's cost, not the verdict's).

    It holds the host it gave last and frees it when asked for the next one, after the verdict has
    let go of it, so that freeing a host's facts is counted here. Only the wall clock is read per
    host: reading the process's CPU clock is a system call that would cost more than the facts it
    measures; the CPU seconds of making the facts are measured by making them alone (_making_cpu).
    """

    def __init__(self, hosts: Iterator[tuple[str, dict[str, Any]]]) -> None:
        self.hosts = hosts
        self.wall = 0.0
        self.last: tuple[str, dict[str, Any]] | None = None

    def __iter__(self) -> _Source:
        return self

    def __next__(self) -> tuple[str, dict[str, Any]]:
        w0 = time.perf_counter()
        try:
            self.last = None
            self.last = next(self.hosts)
            return self.last
        finally:
            self.wall += time.perf_counter() - w0


def _making_cpu(n: int, seed: int) -> float:
    c0 = time.process_time()
    for _ in iter_hosts(n, seed):
        pass
    return time.process_time() - c0


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, float, Any]:
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    result = fn(*args, **kwargs)
    return time.perf_counter() - w0, time.process_time() - c0, result


def _plain_validate(raw: dict[str, dict[str, Any]]) -> dict[str, HostFacts]:
    # The per-host path: each host validated whole, the cyclic GC paused as validate_facts does.
    with gc_paused(freeze=True):
        return {k: HostFacts.model_validate(v) for k, v in raw.items()}


def _peak_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _summary(v: FleetVerdict) -> dict[str, Any]:
    s, p = v.summary, v.plan
    return {"outcome": v.outcome, "passed": s.passed, "warned": s.warned, "failed": s.failed,
            "unreachable": s.unreachable, "findings": s.findings, "needs": len(p.needs_upgrade),
            "done": len(p.done), "blocked": len(p.blocked), "canary": p.canary.host if p.canary else None,
            "waves": len(p.waves), "wave_size": p.wave_size}


def child(path: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """One path at one size, in this process: best of --repeat, then the peak RSS of the runs."""
    target = load_target(None)
    width = max(5, len(str(n - 1)))
    unreachable = {f"gpu{i:0{width}d}": "ssh: connect to host: Connection timed out" for i in range(args.unreachable)}
    start_mb = _peak_mb()
    best: dict[str, Any] = {}
    verdict: FleetVerdict | None = None
    raw = generate(n, args.seed) if path != "stream" else None
    making_cpu = min(_making_cpu(n, args.seed) for _ in range(min(2, args.repeat))) if path == "stream" else 0.0
    for _ in range(args.repeat):
        verdict = None
        stage: dict[str, tuple[float, float]] = {}
        if path == "stream":
            source = _Source(iter_hosts(n, args.seed))
            w, c, verdict = _timed(evaluate_stream, source, target, unreachable)
            w, c = w - source.wall, c - making_cpu
            stage["facts made (left out)"] = (source.wall, making_cpu)
        else:
            assert raw is not None
            if path == "batch":
                wv, cv, (facts, invalid) = _timed(validate_facts, raw)
            else:
                wv, cv, facts = _timed(_plain_validate, raw)
                invalid = {}
            we, ce, verdict = _timed(evaluate_fleet, facts, target, unreachable, invalid=invalid)
            facts = {}
            w, c = wv + we, cv + ce
            stage = {"validate": (wv, cv), "verdict + plan": (we, ce)}
        if not best or w < best["wall"]:
            best = {"wall": w, "cpu": c, "stages": stage}
        gc.unfreeze()
    assert verdict is not None
    out = {"path": path, "n": n, **best, "rss_mb": _peak_mb(), "start_mb": start_mb, "summary": _summary(verdict)}
    if args.digest:
        out["digest"] = hashlib.sha256(verdict.model_dump_json().encode()).hexdigest()
    return out


def _spawn(path: str, n: int, args: argparse.Namespace, digest: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", path, str(n), "--repeat", str(args.repeat),
           "--seed", str(args.seed), "--unreachable", str(args.unreachable)] + (["--digest"] if digest else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_verdict: the {path} run at {n:,} hosts failed (exit {proc.returncode}): "
                         f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _cores() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {_cores()} CPUs"


def _row(r: dict[str, Any], n: int, stream: dict[str, Any] | None) -> str:
    w, c = r["wall"], r["cpu"]
    line = (f"  {r['path']:<9}{w:8.3f} s wall {c:8.3f} s CPU {w / n * 1e6:7.1f} us/host   peak RSS "
            f"{r['rss_mb']:7.0f} MB")
    if stream is not None and r is not stream:
        line += f"   x{w / stream['wall']:4.1f} the stream's time, x{r['rss_mb'] / stream['rss_mb']:4.1f} its RSS"
    return line


def write_slices(n: int, slices: int, base: Path, seed: int, unreachable: int) -> list[Path]:
    """N generated hosts as ``slices`` audit run directories (round robin), as `k3fleet audit` leaves
    them: target.json, facts/<host>.json, run.json, the manifest."""
    target = load_target(None).model_dump(mode="json")
    dirs = [RunDir.create(base, "audit", ["k3fleet", "audit", "--bench-slice", str(i)], out=base / f"slice{i:02d}")
            for i in range(slices)]
    width = max(5, len(str(n - 1)))
    lost = {f"gpu{i:0{width}d}" for i in range(unreachable)}
    counts = [0] * slices
    gone: list[dict[str, str]] = [{} for _ in range(slices)]
    for i, (name, data) in enumerate(iter_hosts(n, seed)):
        k = i % slices
        if name in lost:
            gone[k][name] = "ssh: connect to host: Connection timed out"
            continue
        dirs[k].write_json(layout.facts_file(name), data, durable=False)
        counts[k] += 1
    for rd, hosts, un in zip(dirs, counts, gone, strict=True):
        rd.write_json(layout.TARGET, target)
        rd.write_json(layout.RUN, {"status": "successful", "hosts_total": hosts + len(un), "hosts_with_facts": hosts,
                                   "unreachable": un, "invalid_evidence": {}, "wall_s": 60.0, "exit_code": 0})
        rd.write_manifest()
    return [rd.path for rd in dirs]


def _merge_outcome(code: int, run: Path, stdout: str, stderr: str) -> str:
    """What `k3fleet merge`'s exit code says. 0, 1 and 3 are the verdict's exits (k3fleet/contracts.py:
    pass, checks failed, evidence incomplete), and the generated fleet has failing hosts on purpose,
    so 1 is the expected answer; they count only when the merged run finished (its run.json records
    that same exit code and its manifest verifies). Anything else, a usage error (2), a refused slice
    (3 with no merged run) or a crash, fails the benchmark."""
    last = (stderr.strip().splitlines() or ["no output"])[-1]
    if code not in EXIT_CODES or code == EXIT_USAGE:
        raise SystemExit(f"bench_verdict: k3fleet merge failed (exit {code}): {last}")
    try:
        record = json.loads((run / layout.RUN).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"bench_verdict: k3fleet merge exited {code} without a finished run ({exc}): {last}") from None
    if record.get("exit_code") != code:
        raise SystemExit(f"bench_verdict: k3fleet merge exited {code} but its run.json says "
                         f"{record.get('exit_code')}: {last}")
    report = verify_run(run)
    if not report.ok:
        raise SystemExit(f"bench_verdict: the merged run does not verify against its manifest: {report.summary()}")
    outcome = json.loads((run / layout.VERDICT).read_text()).get("outcome")
    meaning = {EXIT_OK: "pass", EXIT_FAILED: "checks failed on some hosts, as generated",
               EXIT_INCOMPLETE: "evidence incomplete"}[code]
    summary = (stdout.strip().splitlines() or [""])[0]
    return (f"exit {code}, the verdict's ({meaning}: {summary or outcome}); manifest verified")


def _timed_process(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, waited-for children included) of ``cmd`` run to its end."""
    # stderr into a file, read after the end (a pipe could fill and stall it).
    with tempfile.TemporaryFile() as ferr:
        w0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=ferr)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - w0
        ferr.seek(0)
        err = (ferr.read().decode(errors="replace").strip().splitlines() or ["no message"])[-1]
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench_verdict: the floor's {cmd[0]} failed: {err}")
    return wall, usage.ru_utime + usage.ru_stime


# Every facts file of the slices parsed once by the C decoder, in its own process: what no merge can skip.
_PARSE_EACH = ("import json, pathlib, sys\n"
               "for d in sys.argv[1:]:\n"
               "    for f in pathlib.Path(d).glob('facts/*.json'):\n"
               "        json.loads(f.read_bytes())\n")


def merge_floor(paths: list[Path], scratch: Path) -> list[tuple[str, float, float]]:
    """(what, wall s, CPU s) of the floor's three parts on the slices at ``paths``."""
    dirs = [str(p) for p in paths]
    verify = ["sh", "-c", 'find "$@" -type f -print0 | xargs -0 sha256sum', "sh", *dirs]
    scratch.mkdir()
    copy = ["sh", "-c", 'd="$1"; shift; i=0; for s in "$@"; do i=$((i+1)); cp -r "$s/facts" "$d/$i"; done',
            "sh", str(scratch), *dirs]
    parts = [("sha256sum of every slice file", verify), ("cp -r of the facts", copy),
             ("json.loads of each facts file", [sys.executable, "-c", _PARSE_EACH, *dirs])]
    out = [(what, *_timed_process(cmd)) for what, cmd in parts]
    shutil.rmtree(scratch)
    return out


def bench_merge(args: argparse.Namespace) -> int:
    """--merge N: the slices written, then `k3fleet merge` on them in its own process."""
    n = args.merge
    exe = shutil.which("k3fleet", path=str(Path(sys.executable).parent)) or shutil.which("k3fleet")
    if exe is None:
        raise SystemExit("bench_verdict: no k3fleet command beside this Python or on PATH (make venv)")
    with tempfile.TemporaryDirectory(prefix="k3fleet-bench-merge-") as tmp:
        base = Path(tmp)
        w0 = time.perf_counter()
        paths = write_slices(n, args.slices, base / "slices", args.seed, args.unreachable)
        print(f"wrote {n:,} hosts as {args.slices} audit slices in {time.perf_counter() - w0:.1f} s "
              f"({_load_average()})")
        cmd = [exe, "merge", *map(str, paths), "--out", str(base / "merged")]
        if os.environ.get("K3FLEET_BENCH_PROFILE"):
            cmd = [sys.executable, "-m", "cProfile", "-o", os.environ["K3FLEET_BENCH_PROFILE"], *cmd]
        w0 = time.perf_counter()
        # stdout and stderr into files, read after the process ended (a pipe could fill and stall it).
        with open(base / "merge.out", "w+") as fout, open(base / "merge.err", "w+") as ferr:
            proc = subprocess.Popen(cmd, stdout=fout, stderr=ferr, text=True)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - w0
            fout.seek(0)
            stdout = fout.read()
            ferr.seek(0)
            stderr = ferr.read()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if os.environ.get("K3FLEET_BENCH_PROFILE") and proc.returncode == 0:
            # cProfile's main runs the command and exits 0 whatever its exit: the run records the real one.
            with contextlib.suppress(OSError, ValueError):
                proc.returncode = int(json.loads((base / "merged" / layout.RUN).read_text()).get("exit_code", 0))
        verdict_line = _merge_outcome(proc.returncode, base / "merged", stdout, stderr)
        hosts = sum(1 for _ in (base / "merged" / layout.FACTS).glob("*.json"))
        print(f"merge {n} hosts: {wall:.1f} s wall, {usage.ru_maxrss / 1024:.0f} MB peak RSS")
        cpu = usage.ru_utime + usage.ru_stime
        print(f"  CPU {cpu:.1f} s (user {usage.ru_utime:.1f}, system {usage.ru_stime:.1f}); {verdict_line}; "
              f"{hosts:,} facts files in the merged run; goal: under 10 s and {RSS_GOAL_MB} MB on 2 cores")
        print(f"  after: {_load_average()}")
        if args.floor:
            floor = merge_floor(paths, base / "floor")
            total = sum(part_cpu for _, _, part_cpu in floor)
            print("floor on the same slices, no k3fleet: " + "; ".join(
                f"{what} {part_wall:.1f} s wall, {part_cpu:.1f} s CPU" for what, part_wall, part_cpu in floor))
            print(f"  floor {total:.1f} s CPU, at best {total / _cores():.1f} s wall on {_cores()} cores; "
                  f"merge / floor (CPU): {cpu / total:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="hosts, one run per size")
    ap.add_argument("--repeat", type=int, default=3, help="runs per path and size; the best is shown")
    ap.add_argument("--baseline-sizes", type=int, nargs="*", default=[10_000],
                    help="sizes at which the per-host path runs beside the stream")
    ap.add_argument("--batch-sizes", type=int, nargs="*", default=[10_000, 100_000],
                    help="sizes at which the batch path (validate_facts + evaluate_fleet) runs beside the stream")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--unreachable", type=int, default=25, help="hosts reported unreachable")
    ap.add_argument("--merge", type=int, metavar="N",
                    help="write N hosts as audit slices and time `k3fleet merge` on them (a separate process)")
    ap.add_argument("--slices", type=int, default=10, help="--merge: how many audit slices the hosts are split into")
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="--merge: skip the floor (sha256sum, cp -r, json.loads on the same slices)")
    ap.add_argument("--child", nargs=2, metavar=("PATH", "HOSTS"), help=argparse.SUPPRESS)
    ap.add_argument("--digest", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.merge is not None:
        if args.merge < 1 or args.slices < 1:
            raise SystemExit("bench_verdict: --merge and --slices take a positive number")
        return bench_merge(args)
    if args.child:
        path, n = args.child[0], int(args.child[1])
        if path not in PATHS:
            raise SystemExit(f"bench_verdict: unknown path {path!r}; one of {', '.join(PATHS)}")
        print(json.dumps(child(path, n, args)))
        return 0

    print(f"validation + verdict + plan, best of {args.repeat}; each path and size in a fresh process "
          f"(wall s / CPU s; us of wall per host; peak RSS of the process)")
    print(f"before: {_load_average()}")
    streams: list[dict[str, Any]] = []
    for n in args.sizes:
        paths = ["stream"] + (["batch"] if n in args.batch_sizes else []) + (
            ["per-host"] if n in args.baseline_sizes else [])
        runs = [_spawn(p, n, args, digest=len(paths) > 1) for p in paths]
        stream = runs[0]
        streams.append(stream)
        print(f"\n{n:,} hosts")
        for r in runs:
            print(_row(r, n, stream))
            for name, (w, c) in r["stages"].items():
                print(f"    {name:<22}{w:8.3f} s wall {c:8.3f} s CPU")
        print(f"  interpreter and imports before the runs: {stream['start_mb']:.0f} MB")
        goal = GOALS.get(n)
        if goal is not None:
            w, mb = stream["wall"], stream["rss_mb"]
            ok = w < goal and mb < RSS_GOAL_MB
            print(f"  goal (stream): under {goal:g} s and {RSS_GOAL_MB} MB -> {w:.3f} s, {mb:.0f} MB "
                  f"({'within' if ok else 'over'})")
        if len(runs) > 1:
            same = all(r["digest"] == stream["digest"] for r in runs)
            print(f"  same verdict on every path ({', '.join(r['path'] for r in runs)}): {same}")
        s = stream["summary"]
        print(f"  outcome {s['outcome']}; hosts pass/warn/fail/unreachable {s['passed']}/{s['warned']}/"
              f"{s['failed']}/{s['unreachable']}; findings {s['findings']}")
        print(f"  plan: {s['needs']} to change, {s['done']} done, {s['blocked']} blocked, canary {s['canary']}, "
              f"{s['waves']} waves of {s['wave_size']}")
    if len(streams) > 1:
        a, b = streams[0], streams[-1]
        size = b["n"] / a["n"]
        grow, grow_cpu = b["wall"] / a["wall"], b["cpu"] / a["cpu"]
        print(f"\ngrowth {a['n']:,} -> {b['n']:,} hosts (x{size:g}), stream: wall x{grow:.1f}, CPU x{grow_cpu:.1f}, "
              f"peak RSS x{b['rss_mb'] / a['rss_mb']:.1f} (linear: x{size:g}; asked: time at most "
              f"x{GROWTH_GOAL * size / 10:g})")
    print(f"after: {_load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
