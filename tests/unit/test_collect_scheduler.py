"""Slurm collector against recorded scontrol / squeue output: what it collects is what the controller's
SchedulerFacts accepts. scontrol's and squeue's parsers are tested with the collection
(ansible_collections/k3fleet/gpu/tests/unit/plugins/module_utils/test_k3fleet_scheduler.py).

Sources of every fixture: tests/fixtures/scheduler/SOURCES.md (a link to the collection's
tests/unit/fixtures/scheduler, one copy).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nodetree import exe, fixtures

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_scheduler import (
    collect_scheduler,
)
from k3fleet.models.facts import SchedulerFacts

FIX, fixture = fixtures("scheduler")
DRAIN_REASON = "k3fleet CHG-1042 R575->R580 driver change [root@2026-11-29T17:17:55]"


def slurm_bin(bin_dir: Path, scontrol: dict[str, str], squeue: dict[str, str] | None = None,
              scontrol_body: str | None = None, squeue_body: str | None = None) -> None:
    """scontrol/squeue replaying one fixture per node name ($3 of `scontrol show node NODE --oneliner`)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    cases = "".join(f"  {node}) /bin/cat '{FIX / name}'; exit 0;;\n" for node, name in scontrol.items())
    not_found = f"/bin/cat '{FIX / 'scontrol_not_found_slurm2205.stdout'}' | /bin/sed \"s/gpu99/$3/\"; exit 1"
    exe(bin_dir / "scontrol", scontrol_body or f'case "$3" in\n{cases}  *) {not_found};;\nesac')
    if squeue is not None or squeue_body:
        # squeue --noheader --nodelist NODE --states RUNNING --format %A: the node is $3.
        qcases = "".join(f"  {node}) /bin/cat '{FIX / name}'; exit 0;;\n" for node, name in (squeue or {}).items())
        exe(bin_dir / "squeue", squeue_body or f'case "$3" in\n{qcases}  *) exit 0;;\nesac')


def reader_for(tmp_path: Path, hostname: str | None = None, timeout: float = 60.0) -> NodeReader:
    # Far beyond what a replay takes: only the tests about timeouts (which pass their own) may time
    # out; a busy machine once stalled a 5 s replay of squeue past its timeout.
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True, exist_ok=True)
    if hostname is not None:
        (root / "etc" / "hostname").write_text(hostname)
    return NodeReader(root=str(root), path=str(tmp_path / "bin"), timeout=timeout)


# -- collect_scheduler ---------------------------------------------------------------


def test_collect_draining_node_with_a_running_job(tmp_path: Path) -> None:
    slurm_bin(tmp_path / "bin", {"gpu01": "scontrol_gpu01_mixed_drain_slurm2205.txt"},
              {"gpu01": "squeue_gpu01_running_slurm2205.txt"})
    reader = reader_for(tmp_path, hostname="gpu01\n")
    out = collect_scheduler(reader)
    facts = SchedulerFacts.model_validate(out)
    assert (facts.status, facts.kind, facts.node, facts.state) == ("ok", "slurm", "gpu01", "draining")
    assert facts.reason == DRAIN_REASON
    assert facts.jobs_running == 1
    assert out["raw_state"] == "MIXED+DRAIN" and out["node_source"] == "/etc/hostname"
    assert [c["argv"] for c in reader.commands] == [
        ["scontrol", "show", "node", "gpu01", "--oneliner"],
        ["squeue", "--noheader", "--nodelist", "gpu01", "--states", "RUNNING", "--format", "%A"]]


@pytest.mark.parametrize("node, name, state, jobs", [
    ("gpu02", "scontrol_gpu02_idle_drain_slurm2205.txt", "drained", 0),
    ("gpu02", "scontrol_gpu02_allocated_drain_slurm2205.txt", "draining", 0),
    ("gpu01", "scontrol_gpu01_mixed_slurm2205.txt", "mixed", 0),
])
def test_collect_states(tmp_path: Path, node: str, name: str, state: str, jobs: int) -> None:
    slurm_bin(tmp_path / "bin", {node: name}, {node: "squeue_gpu02_none_slurm2205.txt"})
    out = collect_scheduler(reader_for(tmp_path), node=node)
    facts = SchedulerFacts.model_validate(out)
    assert (facts.state, facts.jobs_running, out["node_source"]) == (state, jobs, "argument")


def test_collect_idle_node_has_no_reason(tmp_path: Path) -> None:
    slurm_bin(tmp_path / "bin", {"gpu01": "scontrol_gpu01_mixed_slurm2205.txt"}, {})
    out = collect_scheduler(reader_for(tmp_path), node="gpu01")
    assert out["reason"] is None and out["state"] == "mixed"


def test_collect_unknown_node(tmp_path: Path) -> None:
    slurm_bin(tmp_path / "bin", {"gpu01": "scontrol_gpu01_mixed_slurm2205.txt"}, {})
    out = collect_scheduler(reader_for(tmp_path, hostname="login01\n"))
    facts = SchedulerFacts.model_validate(out)
    assert (facts.status, facts.kind, facts.node) == ("unknown", "slurm", "login01")
    assert "Node login01 not found" in facts.reason and "NodeName" in facts.reason


def test_collect_without_scontrol_is_absent(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    out = collect_scheduler(reader_for(tmp_path), node="gpu01")
    facts = SchedulerFacts.model_validate(out)
    assert (facts.status, facts.kind) == ("absent", "none")
    assert "scontrol not on PATH" in facts.reason


def test_collect_scontrol_timeout(tmp_path: Path) -> None:
    slurm_bin(tmp_path / "bin", {}, scontrol_body="exec /bin/sleep 5")
    out = collect_scheduler(reader_for(tmp_path, timeout=0.3), node="gpu01")
    SchedulerFacts.model_validate(out)
    assert out["status"] == "unknown" and "timed out" in out["reason"]


def test_collect_truncated_scontrol_output(tmp_path: Path) -> None:
    text = fixture("scontrol_gpu01_mixed_drain_slurm2205.txt")
    cut = tmp_path / "cut.txt"
    cut.write_text(text[: text.index("State=")])
    slurm_bin(tmp_path / "bin", {}, {}, scontrol_body=f"/bin/cat '{cut}'")
    out = collect_scheduler(reader_for(tmp_path), node="gpu01")
    facts = SchedulerFacts.model_validate(out)
    assert facts.status == "unknown" and "no State" in facts.reason


def test_collect_garbage_scontrol_output(tmp_path: Path) -> None:
    slurm_bin(tmp_path / "bin", {}, {}, scontrol_body=f"/bin/cat '{FIX / 'squeue_gpu01_running_slurm2205.txt'}'")
    out = collect_scheduler(reader_for(tmp_path), node="gpu01")
    SchedulerFacts.model_validate(out)
    assert out["status"] == "unknown" and "no NodeName=gpu01 record" in out["reason"]


def test_collect_squeue_failure_keeps_the_state(tmp_path: Path) -> None:
    slurm_bin(tmp_path / "bin", {"gpu02": "scontrol_gpu02_idle_drain_slurm2205.txt"},
              squeue_body=f"/bin/cat '{FIX / 'scontrol_gpu02_idle_drain_slurm2205.txt'}'")
    out = collect_scheduler(reader_for(tmp_path), node="gpu02")
    facts = SchedulerFacts.model_validate(out)
    assert facts.status == "ok" and facts.state == "drained"
    assert facts.jobs_running is None and "not one job id per line" in out["jobs_reason"]
