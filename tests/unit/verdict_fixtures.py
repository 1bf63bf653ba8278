"""The verdict tests' synthetic hosts: a fixture of tests/fixtures/verdict (see its README) with dotted
paths patched, and the default target with its GPU strategy pinned."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from k3fleet.models.facts import HostFacts
from k3fleet.targets import load_target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verdict"
GOOD, R575, B200 = "r580_h200_hgx", "r575_h200_hgx", "r580_b200_hgx"
TARGET = load_target(None)
SINGLE = TARGET.model_copy(update={"gpus": TARGET.gpus.model_copy(update={"strategy": "single_node_tp"})})


def raw(base: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"host_{base}.json").read_text())
    return data


def set_path(data: Any, path: str, value: Any) -> None:
    """Set one dotted path (list indexes as numbers); a callable value maps the old value."""
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last: Any = int(keys[-1]) if isinstance(node, list) else keys[-1]
    node[last] = value(node[last]) if callable(value) else value


def patched(data: dict[str, Any], patch: dict[str, Any] | None) -> dict[str, Any]:
    """``data`` with every dotted path of ``patch`` set."""
    for path, value in (patch or {}).items():
        set_path(data, path, value)
    return data


def host_raw(name: str, base: str = GOOD, patch: dict[str, Any] | None = None) -> dict[str, Any]:
    data = raw(base)
    data["host"] = data["hostname"] = data["scheduler"]["node"] = name
    if base == R575:
        data["rdma"]["nvidia_peermem_loaded"] = True
    return patched(data, patch)


def host(name: str, base: str = GOOD, patch: dict[str, Any] | None = None) -> HostFacts:
    return HostFacts.model_validate(host_raw(name, base, patch))


def fleet(*hosts: HostFacts) -> dict[str, HostFacts]:
    return {h.host: h for h in hosts}


FAULTS: list[dict[str, Any]] = [
    {},
    {"rdma.nvidia_peermem_loaded": False},
    {"fabricmanager.unit.active": "failed"},
    {"nccl.settings": {"NCCL_DEBUG": {"value": "INFO", "source": "env"}}},
    {"scheduler.state": "drained", "scheduler.reason": "hw check"},
    {"scheduler.state": "mixed", "scheduler.jobs_running": 2},
    {"driver.gpus": lambda gs: [{**g, "memory_used_mib": 131072, "processes": [
        {"pid": 7, "type": "C", "name": "python3", "used_memory_mib": 131072}]} for g in gs]},
    {"driver.gpus": lambda gs: gs[:7], "driver.gpu_count": 7},
    {"packages": {"status": "unknown", "reason": "dpkg-query: command not found"}},
    {"container.image.digest": "sha256:0c4d1e2f3a5b"},
]


def fleet_raw(n: int, seed: int = 3) -> dict[str, dict[str, Any]]:
    rng = random.Random(seed)
    out: dict[str, dict[str, Any]] = {}
    for i in range(n):
        name = f"h{i:03d}"
        data = host_raw(name, rng.choice([GOOD, R575, R575, B200]), rng.choice(FAULTS))
        for g in data["driver"]["gpus"]:
            g["uuid"] = f"GPU-{i:08x}-{g['index']:04x}-0000-0000-000000000000"
        out[name] = data
    return out
