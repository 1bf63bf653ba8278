#!/usr/bin/env python3
"""Time fact validation and the fleet verdict on a large generated fleet.

Generates N varied host fact dicts (default 10,000) from the synthetic fixtures in
tests/fixtures/verdict (R575 and R580 hosts, H200/H100/B200, broken GPUs, Fabric Manager
down, rails down, NCCL debug left on, unknown sections, busy and drained nodes, image
drift), then times separately:

  1. validation: HostFacts.model_validate for every dict, through validate_facts (the
     controller's path: the cyclic GC paused for the bulk step); a plain loop with the GC
     running is shown for comparison
  2. verdict:    evaluate_fleet over the validated facts (findings, drift, plan)
  3. JSON:       FleetVerdict.model_dump_json (informative)

Prints the figures; asserts nothing about time (machines differ).

    .venv/bin/python scripts/bench_verdict.py [--hosts 10000] [--repeat 3] [--seed 7]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from k3fleet.models.facts import HostFacts  # noqa: E402
from k3fleet.targets import load_target  # noqa: E402
from k3fleet.verdict import evaluate_fleet, validate_facts  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "verdict"


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def _vary(base: dict[str, Any], name: str, rng: random.Random) -> dict[str, Any]:
    d = copy.deepcopy(base)
    d["host"] = d["hostname"] = name
    d["scheduler"]["node"] = name
    r = rng.random()
    drv = d["driver"]
    # Each branch below is one realistic fault class; most hosts stay clean.
    if r < 0.03:
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
    r580 = _load("host_r580_h200_hgx.json")
    b200 = _load("host_r580_b200_hgx.json")
    h100 = copy.deepcopy(r575)
    for g in h100["driver"]["gpus"]:
        g["name"], g["memory_total_mib"] = "NVIDIA H100 80GB HBM3", 81559
    bases = [(r575, 0.55), (h100, 0.15), (r580, 0.2), (b200, 0.1)]
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
        name = f"gpu{i:05d}"
        out[name] = _vary(base, name, rng)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per phase; the best and median are shown")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--unreachable", type=int, default=25, help="hosts reported unreachable")
    args = ap.parse_args()

    target = load_target(None)
    raw = generate(args.hosts, args.seed)
    names = sorted(raw)
    unreachable = {h: "ssh: connect to host: Connection timed out" for h in names[: args.unreachable]}

    t_val: list[float] = []
    t_eval: list[float] = []
    t_json: list[float] = []
    t_plain: list[float] = []
    verdict = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        facts, invalid = validate_facts(raw)
        t1 = time.perf_counter()
        verdict = evaluate_fleet(facts, target, unreachable, invalid=invalid)
        t2 = time.perf_counter()
        verdict.model_dump_json()
        t3 = time.perf_counter()
        t_val.append(t1 - t0)
        t_eval.append(t2 - t1)
        t_json.append(t3 - t2)
        del facts
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        plain = {k: HostFacts.model_validate(v) for k, v in raw.items()}
        t_plain.append(time.perf_counter() - t0)
        del plain
    assert verdict is not None

    def row(label: str, xs: list[float]) -> str:
        return (f"{label:<28} best {min(xs):7.3f} s   median {statistics.median(xs):7.3f} s   "
                f"{min(xs) / args.hosts * 1e6:7.1f} us/host")

    s = verdict.summary
    print(f"hosts: {args.hosts} ({args.unreachable} unreachable), runs: {args.repeat}")
    print(row("validate (HostFacts)", t_val))
    print(row("evaluate_fleet", t_eval))
    print(row("validate + evaluate", [a + b for a, b in zip(t_val, t_eval, strict=True)]))
    print(row("FleetVerdict JSON (extra)", t_json))
    print(row("plain loop, GC on (compare)", t_plain))
    print(f"outcome: {verdict.outcome}, exit code {verdict.exit_code}")
    print(f"hosts pass/warn/fail/unreachable: {s.passed}/{s.warned}/{s.failed}/{s.unreachable}; "
          f"findings {s.findings}; GPUs healthy {s.gpus_healthy}, after plan {s.gpus_after_plan}")
    p = verdict.plan
    print(f"plan: {len(p.needs_upgrade)} to upgrade, {len(p.done)} done, {len(p.blocked)} blocked, "
          f"canary {p.canary.host if p.canary else None}, {len(p.waves)} waves of {p.wave_size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
