# -*- coding: utf-8 -*-
# Stdlib only: shipped to nodes.
"""All collectors in one pass: what the audit runs, once per host."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader, guard
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_container import collect_container
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_counters import counter_facts, sample_counters
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import collect_driver
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_fabricmanager import collect_fabricmanager
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_imex import collect_imex
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_packages import collect_packages
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_rdma import collect_nccl, collect_rdma
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_scheduler import collect_scheduler
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import (
    FACTS_SCHEMA_VERSION,
    FILES,
    HOSTNAME_LIMIT,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_workloads import collect_workloads

# Defined in k3fleet_sources, which the controller reads too.
SCHEMA_VERSION = FACTS_SCHEMA_VERSION


def node_hostname(reader: NodeReader) -> str | None:
    text = reader.read_cached(FILES["hostname"], limit=HOSTNAME_LIMIT)
    if text and text.strip():
        return text.strip().split()[0]
    if reader.root == "/":
        return socket.gethostname()
    return None


def _counters(reader: NodeReader, facts: dict[str, Any], first: dict[str, Any], use_nvml: bool,
              interval: float | None) -> None:
    """The second counter sample, at least ``interval`` seconds after the first (within the node's time
    budget), and both into the driver and RDMA sections (docs/facts.md section 14)."""
    if interval and reader.deadline is not None:
        interval = min(interval, max(0.0, reader.deadline - time.time() - 1.0))
    wait = first["at"] + (interval or 0) - time.time()
    if wait > 0:
        time.sleep(wait)
    second = sample_counters(reader, use_nvml=use_nvml, rdma=bool(first["ib"]))
    driver_counters, rdma_counters = counter_facts(first, second)
    if isinstance(facts["driver"], dict) and facts["driver"].get("gpus"):
        facts["driver"]["counters"] = driver_counters
    if isinstance(facts["rdma"], dict) and facts["rdma"].get("devices"):
        facts["rdma"]["counters"] = rdma_counters


def collect_host(reader: NodeReader, host: str, image: str, use_nvml: bool = True, runtime: str = "auto",
                 probe: bool = False, env_files: Sequence[str] = (), lspci: bool = True,
                 slurm_node: str | None = None, environ: Mapping[str, str] | None = None, active: str = "none",
                 active_spec: dict[str, Any] | None = None, counter_interval: float = 0.0) -> dict[str, Any]:
    """Return the HostFacts dict for one node; every section is guarded independently.

    Error counters (IB ports, NVLink links, PCIe replays) are sampled first and again at the end of the
    visit, at least ``counter_interval`` seconds apart: the verdict judges their rate.
    """
    started = time.time()
    first = guard("counters", sample_counters, reader, use_nvml=use_nvml)
    driver = guard("driver", collect_driver, reader, use_nvml=use_nvml)
    packages = guard("packages", collect_packages, reader)
    facts = {
        "schema_version": SCHEMA_VERSION,
        "host": host,
        "hostname": guard("hostname", node_hostname, reader),
        "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "driver": driver,
        "packages": packages,
        "fabricmanager": guard("fabricmanager", collect_fabricmanager, reader, driver=driver,
                               packages=packages),
        # IMEX on multi-node NVLink racks (docs/facts.md section 15; optional in schema 1.1).
        "imex": guard("imex", collect_imex, reader),
        "rdma": guard("rdma", collect_rdma, reader, lspci=lspci),
        "nccl": guard("nccl", collect_nccl, reader, env_files=env_files, environ=environ),
        "container": guard("container", collect_container, reader, image, runtime=runtime, probe=probe,
                           packages=packages),
        "scheduler": guard("scheduler", collect_scheduler, reader, node=slurm_node),
    }
    # Other tenants' CUDA work (docs/facts.md section 16): read from what the container, driver and
    # package collectors found, in the same round trip.
    if isinstance(facts["container"], dict):
        facts["container"]["workloads"] = guard("workloads", collect_workloads, reader, facts["container"],
                                                driver, packages)
    if isinstance(first, dict) and "at" in first:
        # Before the active checks: their load must not count as the node's own errors.
        guard("counters", _counters, reader, facts, first, use_nvml, counter_interval)
    # Active checks (docs/facts.md section 17) last: every state read above is in before they load the node.
    if active in ("quick", "full") and active_spec:
        # Imported here: an audit without active checks does not compile them on every node.
        from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_active import collect_active

        facts["active"] = guard("active", collect_active, reader, active, active_spec, driver, facts["rdma"],
                                scheduler=facts["scheduler"])
    if not isinstance(facts["hostname"], str):
        facts["hostname"] = None
    facts["commands"] = reader.commands
    facts["duration_s"] = round(time.time() - started, 3)
    return facts
