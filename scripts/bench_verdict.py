#!/usr/bin/env python3
"""Time validation + verdict + change plan on large generated fleets, against the per-host path.

Generates N host fact dicts per size (default 10,000 and 100,000) from the synthetic fixtures in
tests/fixtures/verdict, as a production fleet looks the night before the change: R575 and R580
hosts, H200/H100/B200, each host with its own name and GPU UUIDs, most hosts clean, a few percent
in each realistic fault class (GPUDirect missing, GPUs held by a model server outside the
scheduler, a GPU missing, Fabric Manager down, a rail down, NCCL debug left on, package facts
unreadable, image drift, a pending reboot, persistence off), 30% running jobs, 3% drained, and
25 unreachable hosts. The plan therefore has a canary and waves, so the planner is measured too.

Per size it times, best of --repeat runs, wall and CPU seconds of:

  1. validation: validate_facts (sections repeated across hosts validated once per content)
  2. verdict + plan: evaluate_fleet (host rules once per node kind, drift, capacity, plan)

and, side by side in the same run, the per-host path (HostFacts.model_validate per host, every
rule run per host) at the sizes given by --baseline-sizes, with the ratio. Growth between the
sizes is printed against linear growth. Nothing is asserted: machines differ, and a machine
shared with other work inflates wall time (CPU seconds are shown beside it).

    .venv/bin/python scripts/bench_verdict.py [--sizes 10000 100000] [--repeat 3] [--baseline-sizes 10000]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from k3fleet.models.facts import HostFacts  # noqa: E402
from k3fleet.models.findings import FleetVerdict  # noqa: E402
from k3fleet.targets import load_target  # noqa: E402
from k3fleet.verdict import evaluate_fleet, validate_facts  # noqa: E402
from k3fleet.verdict.intake import gc_paused  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "verdict"
# What the issue asks of this machine: validation + verdict + plan.
GOALS = {10_000: 1.0, 100_000: 10.0}


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
    out: dict[str, dict[str, Any]] = {}
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
        out[name] = _vary(base, name, i, rng)
    return out


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, float, Any]:
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    result = fn(*args, **kwargs)
    return time.perf_counter() - w0, time.process_time() - c0, result


def _plain_validate(raw: dict[str, dict[str, Any]]) -> dict[str, HostFacts]:
    # The previous controller path: each host validated whole, the cyclic GC paused as validate_facts does.
    with gc_paused(freeze=True):
        return {k: HostFacts.model_validate(v) for k, v in raw.items()}


def run_size(n: int, args: argparse.Namespace, target: Any) -> dict[str, Any]:
    raw = generate(n, args.seed)
    names = sorted(raw)
    unreachable = {h: "ssh: connect to host: Connection timed out" for h in names[: args.unreachable]}
    best: dict[str, tuple[float, float]] = {}
    verdict: FleetVerdict | None = None
    for _ in range(args.repeat):
        w_val, c_val, (facts, invalid) = _timed(validate_facts, raw)
        w_ev, c_ev, verdict = _timed(evaluate_fleet, facts, target, unreachable, invalid=invalid)
        for key, w, c in (("validate", w_val, c_val), ("verdict", w_ev, c_ev),
                          ("total", w_val + w_ev, c_val + c_ev)):
            if key not in best or w < best[key][0]:
                best[key] = (w, c)
        facts = {}
        gc.unfreeze()
    out: dict[str, Any] = {"n": n, "best": best, "verdict": verdict}
    if n in args.baseline_sizes:
        # The per-host path: every host validated whole and judged rule by rule on its own.
        w_val, c_val, plain = _timed(_plain_validate, raw)
        w_ev, c_ev, base_verdict = _timed(evaluate_fleet, plain, target, unreachable)
        out["baseline"] = {"validate": (w_val, c_val), "verdict": (w_ev, c_ev),
                           "total": (w_val + w_ev, c_val + c_ev)}
        assert verdict is not None
        out["same"] = base_verdict.model_dump_json() == verdict.model_dump_json()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; the best is shown")
    ap.add_argument("--baseline-sizes", type=int, nargs="*", default=[10_000],
                    help="sizes at which the per-host path is timed beside it (once each)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--unreachable", type=int, default=25, help="hosts reported unreachable")
    args = ap.parse_args()

    target = load_target(None)
    results = [run_size(n, args, target) for n in args.sizes]

    print(f"validation + verdict + plan, best of {args.repeat} (wall s / CPU s; per host in us of wall)")
    for r in results:
        n = r["n"]
        print(f"\n{n:,} hosts")
        for key in ("validate", "verdict", "total"):
            w, c = r["best"][key]
            line = f"  {key:<9} {w:8.3f} s wall {c:8.3f} s CPU {w / n * 1e6:8.1f} us/host"
            if "baseline" in r:
                bw, bc = r["baseline"][key]
                line += f"   per-host path {bw:8.3f} s wall {bc:8.3f} s CPU   x{bw / w:5.1f} faster"
            print(line)
        goal = GOALS.get(n)
        if goal is not None:
            w = r["best"]["total"][0]
            print(f"  goal: under {goal:g} s -> {w:.3f} s ({'within' if w < goal else 'over'})")
        if "same" in r:
            print(f"  same verdict as the per-host path: {r['same']}")
        v = r["verdict"]
        s, p = v.summary, v.plan
        print(f"  outcome {v.outcome}; hosts pass/warn/fail/unreachable {s.passed}/{s.warned}/{s.failed}/"
              f"{s.unreachable}; findings {s.findings}")
        print(f"  plan: {len(p.needs_upgrade)} to change, {len(p.done)} done, {len(p.blocked)} blocked, canary "
              f"{p.canary.host if p.canary else None}, {len(p.waves)} waves of {p.wave_size}")
    if len(results) > 1:
        a, b = results[0], results[-1]
        size = b["n"] / a["n"]
        grow = b["best"]["total"][0] / a["best"]["total"][0]
        grow_cpu = b["best"]["total"][1] / a["best"]["total"][1]
        print(f"\ngrowth {a['n']:,} -> {b['n']:,} hosts (x{size:g}): wall x{grow:.1f}, CPU x{grow_cpu:.1f} "
              f"(linear: x{size:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
