"""A small simulated lab fleet judged in-process: the lab's profiles, a fleet file, the real collector
on each rendered host (no Ansible), validation and the fleet verdict. For unit tests of one lab case."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_host import collect_host
from k3fleet.lab.fleet import default_image, expand_hosts, generate_fleet, load_fleet
from k3fleet.targets import load_target
from k3fleet.verdict import evaluate_fleet, validate_facts

ROOT = Path(__file__).resolve().parents[2]


def lab_fleet_verdict(workdir: Path, fleet_yaml: str, target: Any = None, **collect: Any) -> Any:
    """The verdict of the lab fleet ``fleet_yaml`` (a fleet file's text, profiles from the lab), every
    host collected with the container probe on and NVML off, plus ``collect``'s options."""
    shutil.copytree(ROOT / "inventories" / "lab" / "profiles", workdir / "profiles")
    (workdir / "fleet.yaml").write_text(fleet_yaml)
    spec = load_fleet(workdir / "fleet.yaml")
    generate_fleet(spec, workdir / "out")
    raw = {}
    for name, _host in expand_hosts(spec, None):
        root = workdir / "out" / "hosts" / name
        raw[name] = collect_host(NodeReader(root=str(root), path=str(root / "bin"), timeout=10), name,
                                 default_image(), use_nvml=False, probe=True, **collect)
    facts, invalid = validate_facts(raw, freeze=False)
    assert invalid == {}
    return evaluate_fleet(facts, target if target is not None else load_target(None), {})
