"""Slurm collector against recorded scontrol / squeue output.

Sources of every fixture: tests/fixtures/scheduler/SOURCES.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nodetree import exe, fixtures

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_scheduler import (
    collect_scheduler,
    count_running_jobs,
    normalize_slurm_state,
    parse_scontrol_nodes,
    short_hostname,
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


# -- pure parsers ----------------------------------------------------------------


@pytest.mark.parametrize("name, node, state, reason", [
    ("scontrol_gpu01_mixed_slurm2205.txt", "gpu01", "MIXED", None),
    ("scontrol_gpu02_allocated_slurm2205.txt", "gpu02", "ALLOCATED", None),
    ("scontrol_gpu01_mixed_drain_slurm2205.txt", "gpu01", "MIXED+DRAIN", DRAIN_REASON),
    ("scontrol_gpu02_allocated_drain_slurm2205.txt", "gpu02", "ALLOCATED+DRAIN", DRAIN_REASON),
    ("scontrol_gpu02_idle_drain_slurm2205.txt", "gpu02", "IDLE+DRAIN", DRAIN_REASON),
    ("scontrol_gn0101_idle_drain_twcc.txt", "gn0101.twcc.ai", "IDLE+DRAIN", "node-switch [root@2018-11-23T12:49:03]"),
    ("scontrol_med0304_mixed_drain_bih.txt", "med0304", "MIXED+DRAIN",
     "deep power-off required for PSU [root@2020-07-17T13:21:02]"),
    ("scontrol_a256_t4_01_mixed_aau.txt", "a256-t4-01", "MIXED", None),
])
def test_parse_scontrol_nodes(name: str, node: str, state: str, reason: str | None) -> None:
    records = parse_scontrol_nodes(fixture(name))
    assert len(records) == 1
    fields = records[0]
    assert fields["NodeName"] == node
    assert fields["State"] == state
    assert fields.get("Reason") == reason


@pytest.mark.parametrize("name, key, value", [
    ("scontrol_gpu01_mixed_slurm2205.txt", "OS", "Linux 6.18.44-fc-v857 #1 SMP PREEMPT_DYNAMIC @0"),
    ("scontrol_gpu01_mixed_slurm2205.txt", "CfgTRES", "cpu=2,mem=1000M,billing=2"),
    ("scontrol_gn0101_idle_drain_twcc.txt", "AllocTRES", ""),
    ("scontrol_gpu01_mixed_drain_slurm2205.txt", "AllocTRES", "cpu=1,mem=1000M"),
    ("scontrol_gn0101_idle_drain_twcc.txt", "Gres", "gpu:8"),
    ("scontrol_med0304_mixed_drain_bih.txt", "OS",
     "Linux 3.10.0-1127.13.1.el7.x86_64 #1 SMP Tue Jun 23 15:46:38 UTC 2020"),
])
def test_parse_scontrol_values_with_spaces_and_equals(name: str, key: str, value: str) -> None:
    assert parse_scontrol_nodes(fixture(name))[0][key] == value


def test_parse_scontrol_several_records() -> None:
    text = "\n".join(fixture(n) for n in ("scontrol_gpu01_mixed_slurm2205.txt", "scontrol_med0304_mixed_drain_bih.txt",
                                          "scontrol_gpu02_idle_drain_slurm2205.txt"))
    assert [r["NodeName"] for r in parse_scontrol_nodes(text)] == ["gpu01", "med0304", "gpu02"]


@pytest.mark.parametrize("raw, state, flags", [
    ("IDLE", "idle", []),
    ("MIXED", "mixed", []),
    ("ALLOCATED", "allocated", []),
    ("IDLE+DRAIN", "drained", ["drain"]),
    ("MIXED+DRAIN", "draining", ["drain"]),
    ("ALLOCATED+DRAIN", "draining", ["drain"]),
    ("COMPLETING+DRAIN", "draining", ["drain"]),
    ("DOWN+DRAIN+NOT_RESPONDING", "down", ["drain", "not_responding"]),
    ("DOWN*", "down", ["not_responding"]),
    ("IDLE*", "idle", ["not_responding"]),
    ("IDLE+CLOUD+POWERED_DOWN", "idle", ["cloud", "powered_down"]),
    ("MIXED+FAIL", "failing", ["fail"]),
    ("IDLE+FAIL", "fail", ["fail"]),
    ("DRAINED", "drained", []),
    ("", None, []),
])
def test_normalize_slurm_state(raw: str, state: str | None, flags: list[str]) -> None:
    assert normalize_slurm_state(raw) == (state, flags)


@pytest.mark.parametrize("text, expected", [
    (fixture("squeue_gpu01_running_slurm2205.txt"), 1),
    (fixture("squeue_gpu02_none_slurm2205.txt"), 0),
    ("1\n2\n3_4\n5+0\n", 4),
    (fixture("scontrol_gpu01_mixed_slurm2205.txt"), None),  # not squeue output at all
])
def test_count_running_jobs(text: str, expected: int | None) -> None:
    assert count_running_jobs(text) == expected


@pytest.mark.parametrize("content, expected", [
    ("gpu01\n", "gpu01"),
    ("gpu010.cluster.example\n", "gpu010"),
])
def test_short_hostname_from_etc_hostname(tmp_path: Path, content: str, expected: str) -> None:
    assert short_hostname(reader_for(tmp_path, hostname=content)) == (expected, "/etc/hostname")


def test_short_hostname_falls_back_to_the_process(tmp_path: Path) -> None:
    name, source = short_hostname(reader_for(tmp_path, hostname=""))
    assert source == "gethostname()" and name and "." not in name


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
